// placeholder
#ifndef GPU_LESSONS_NO_MAIN
int main() { return 77; }
#endif
