#!/bin/sh
# labs_graded.sh ROOT LAB_BUILD_DIR FLAVOUR: for every lab in ROOT/labs, the untouched starter
# builds and fails scripts/grade-lab (exit 1: built, some check failed), and the lesson's own folder
# passes it (exit 0). So the grader can neither pass an empty answer nor fail a right one. And lab
# 05 done but for its moves (the model and the batches stay on the host) fails, saying so: on a
# CPU-only machine, where such a submission still trains.
set -u
root=$1
export LAB_BUILD_DIR=$2 GPU_LESSONS_TORCH=$3
status=0
for lab in "$root"/labs/[0-9][0-9]_*/; do
  name=$(basename "$lab")
  nn=$(echo "$name" | cut -c1-2)
  "$root/scripts/grade-lab" "$nn" >"$LAB_BUILD_DIR.$nn.starter.log" 2>&1
  starter=$?
  "$root/scripts/grade-lab" "$nn" "$root/lessons/$name" >"$LAB_BUILD_DIR.$nn.lesson.log" 2>&1
  lesson=$?
  echo "lab $nn: starter exit $starter (want 1): $(tail -1 "$LAB_BUILD_DIR.$nn.starter.log")"
  echo "lab $nn: lesson  exit $lesson (want 0): $(tail -1 "$LAB_BUILD_DIR.$nn.lesson.log")"
  if [ "$starter" -ne 1 ]; then cat "$LAB_BUILD_DIR.$nn.starter.log"; status=1; fi
  if [ "$lesson" -ne 0 ]; then cat "$LAB_BUILD_DIR.$nn.lesson.log"; status=1; fi
done
nomove=$LAB_BUILD_DIR.05-moves-nothing
rm -rf "$nomove"
cp -r "$root/lessons/05_training_loop" "$nomove"
sed -i -e 's#^\( *\)trainer\.model->to(device);.*#\1(void)device;#' \
       -e 's#host\.\(images\|labels\)\.to(device_, /\*non_blocking=\*/pinned_)#host.\1#' \
       "$nomove/training_loop.cpp"
changed=$(diff "$root/lessons/05_training_loop/training_loop.cpp" "$nomove/training_loop.cpp" |
          grep -c '^>')
if [ "$changed" -ne 4 ]; then  # two model moves, two batch copies: the lesson's lines changed
  echo "lab 05 moving nothing: the edit changed $changed lines, not 4: update the sed above"
  exit 1
fi
"$root/scripts/grade-lab" 05 "$nomove" >"$nomove.log" 2>&1
code=$?
echo "lab 05 moving nothing: exit $code (want 1): $(tail -1 "$nomove.log")"
if [ "$code" -ne 1 ] || ! grep -q "moved nothing to the device" "$nomove.log" ||
   ! grep -q "stayed on the host" "$nomove.log"; then
  cat "$nomove.log"
  status=1
fi
exit $status
