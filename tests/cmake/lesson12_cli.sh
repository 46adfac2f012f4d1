#!/bin/sh
# Lesson 12 driven from the command line: lesson12_cli.sh BINARY CASE
#   resume          --epochs 1, then --epochs 2 in a second process (it resumes), then --epochs 2
#                   again (nothing to train): each passes
#   other-settings  a checkpoint of a --quick run resumed without --quick: exit 2 with a HINT
#   corrupt         a checkpoint of random bytes: exit 2 with a HINT
#   unwritable      --checkpoint in a folder that does not exist: exit 2 before any training
#   help            --help lists the learner's flags, not the crash test's own (--save-loop)
set -u
binary=$1
case=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
expect() {  # expect CODE PATTERN COMMAND...: the exit code, and PATTERN in the output
  code=$1 pattern=$2
  shift 2
  "$@" >"$dir/out" 2>&1
  got=$?
  if [ "$got" -ne "$code" ] || ! grep -q -- "$pattern" "$dir/out"; then
    cat "$dir/out"
    echo "expected exit $code and '$pattern', got exit $got" >&2
    exit 1
  fi
}
case $case in
  resume)
    expect 0 "no checkpoint at" "$binary" --quick --checkpoint "$dir/run.pt" --epochs 1
    expect 0 "resumed from .*epoch 1" "$binary" --quick --checkpoint "$dir/run.pt" --epochs 2
    expect 0 "already at epoch 2" "$binary" --quick --checkpoint "$dir/run.pt" --epochs 2 ;;
  other-settings)
    expect 0 "RESULT: PASS" "$binary" --quick --checkpoint "$dir/run.pt" --epochs 1
    expect 2 "HINT: resume with the flags" "$binary" --checkpoint "$dir/run.pt" --epochs 2 ;;
  corrupt)
    head -c 100000 /dev/urandom >"$dir/run.pt"
    expect 2 "HINT:" "$binary" --quick --checkpoint "$dir/run.pt" --epochs 1 ;;
  unwritable)
    expect 2 "HINT: create the folder" "$binary" --quick --checkpoint "$dir/no/such/run.pt" ;;
  help)
    expect 0 "--checkpoint" "$binary" --help
    if grep -q -- "--save-loop\|--in-place" "$dir/out"; then
      cat "$dir/out"; echo "--help lists the crash test's flags" >&2; exit 1
    fi ;;
  *) echo "unknown case $case" >&2; exit 1 ;;
esac
