#!/bin/sh
# expect_exit.sh CODE PROGRAM [ARGS...]: passes when PROGRAM exits with CODE; otherwise prints
# both codes and the end of the program's output (what the grader shows for a failed check).
code=$1
shift
out=$("$@" 2>&1)
got=$?
[ "$got" -eq "$code" ] && exit 0
echo "exit $got, expected $code, from: $*"
printf '%s\n' "$out" | tail -20
exit 1
