#!/bin/sh
# interrupt.sh BINARY CASE: Ctrl-C (SIGINT) during training, sent once the first epoch is done.
#   lesson05  the run stops at the end of the step under way, says where, and exits 130
#   lesson11  the same, in lesson 11's tutorial run (lesson 05's loop, from common/ann.h)
#   lesson10  the same, and the checkpoint keeps the last whole epoch: no other file is left, and
#             a second run resumes from it
#   lesson12  the same for lesson 12's atomic checkpoint
#   other     the same, for a lesson whose epochs run through common/report.h's run_epochs
#             ("epoch 1/N") and that takes --epochs (gpu_lessons_add_lesson's STOPS_ON_CTRL_C)
set -u
binary=$1
case=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/out"; echo "interrupt.sh $case: $*" >&2; exit 1; }
case $case in
  lesson05) set -- --device cpu --quick --epochs 100; first="Epoch 1, " ;;
  lesson10) set -- --device cpu --quick --checkpoint "$dir/run.pt" --epochs 100; first="Epoch 1, " ;;
  lesson12) set -- --device cpu --quick --checkpoint "$dir/run.pt" --epochs 100; first="epoch 1/100" ;;
  lesson11) set -- --device cpu --quick --run tutorial --epochs 100; first="epoch 1/100" ;;
  *) set -- --device cpu --quick --epochs 100; first="epoch 1/100" ;;
esac
"$binary" "$@" >"$dir/out" 2>&1 &
pid=$!
waited=0
until grep -q "$first" "$dir/out"; do  # the first epoch is done (and saved)
  kill -0 "$pid" 2>/dev/null || fail "ended before its first epoch"
  [ "$waited" -lt 2400 ] || { kill -9 "$pid"; fail "no epoch within 240 s"; }
  sleep 0.1
  waited=$((waited + 1))
done
kill -INT "$pid"
wait "$pid"
code=$?
[ "$code" -eq 130 ] || fail "exit $code after SIGINT, want 130"
grep -q "^stopped (Ctrl-C): " "$dir/out" || fail "no 'stopped (Ctrl-C):' line"
if [ "$case" = lesson10 ] || [ "$case" = lesson12 ]; then
  grep -q "holds epoch" "$dir/out" || fail "does not say which epoch the checkpoint holds"
  leftovers=$(ls -A "$dir" | grep -v -e '^out$' -e '^run.pt$')
  [ -z "$leftovers" ] || fail "left behind: $leftovers"
  "$binary" --device cpu --quick --checkpoint "$dir/run.pt" --epochs 1 >"$dir/out" 2>&1 ||
    fail "the checkpoint does not resume"
  grep -q "already at epoch" "$dir/out" || fail "the resumed run did not find its epochs"
fi
tail -1 "$dir/out"
