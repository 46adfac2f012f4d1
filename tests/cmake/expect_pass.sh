#!/bin/sh
# expect_pass.sh PROGRAM [ARGS...]: passes when PROGRAM exits 0 and its last line is its verdict,
# "RESULT: PASS ..."; exit 77 (waived) is passed on, for CTest to count as skipped. Otherwise
# prints the exit code and the end of the program's output.
out=$("$@" 2>&1)
got=$?
printf '%s\n' "$out"
[ "$got" -eq 77 ] && exit 77
last=$(printf '%s\n' "$out" | tail -n 1)
case "$last" in
  "RESULT: PASS"*) [ "$got" -eq 0 ] && exit 0 ;;
esac
echo "exit $got with the last line '$last', expected exit 0 and 'RESULT: PASS ...', from: $*"
exit 1
