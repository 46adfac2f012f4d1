// lesson_entry.cpp: the entry point of every lesson executable. Each lesson defines
// lesson_main() (CMake renames it per lesson, lesson09_data_parallel_main and so on, so that one
// lesson can link another's library); this file only guards it (errors with a HINT exit 2,
// others end in FAIL).
#include "common/verdict.h"

int lesson_main(int argc, char** argv);

int main(int argc, char** argv) { return course::run_lesson(lesson_main, argc, argv); }
