// lesson_entry.cpp: the entry point of every lesson executable. Each lesson defines
// lesson_main(); this file only guards it (errors with a HINT exit 2, others end in FAIL).
#include "common/verdict.h"

int lesson_main(int argc, char** argv);

int main(int argc, char** argv) { return course::run_lesson(lesson_main, argc, argv); }
