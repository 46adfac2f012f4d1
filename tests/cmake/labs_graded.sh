#!/bin/sh
# labs_graded.sh ROOT LAB_BUILD_DIR FLAVOUR: for every lab in ROOT/labs, the untouched starter
# builds and fails scripts/grade-lab (exit 1: built, some check failed), and the lesson's own folder
# passes it (exit 0). So the grader can neither pass an empty answer nor fail a right one. And labs
# 05 and 11 done but for their moves (the batches, and in 11 the model, stay on the host) fail,
# saying so: on a CPU-only machine, where such a submission still trains.
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
# moves_nothing NN FILE COUNT SED PATTERN...: lesson NN with the sed edit applied to FILE (which must
# change COUNT lines) fails its grading, and the grader's output holds every PATTERN.
moves_nothing() {
  nn=$1 file=$2 count=$3 edit=$4
  shift 4
  lesson=$(ls -d "$root"/lessons/"$nn"_*)
  nomove=$LAB_BUILD_DIR.$nn-moves-nothing
  rm -rf "$nomove"
  cp -r "$lesson" "$nomove"
  sed -i "$edit" "$nomove/$file"
  changed=$(diff "$lesson/$file" "$nomove/$file" | grep -c '^>')
  if [ "$changed" -ne "$count" ]; then  # the lesson's lines changed: update the edit
    echo "lab $nn moving nothing: the edit changed $changed lines, not $count: update the sed"
    status=1
    return
  fi
  "$root/scripts/grade-lab" "$nn" "$nomove" >"$nomove.log" 2>&1
  code=$?
  echo "lab $nn moving nothing: exit $code (want 1): $(tail -1 "$nomove.log")"
  ok=1
  [ "$code" -eq 1 ] || ok=0
  for pattern in "$@"; do grep -q "$pattern" "$nomove.log" || ok=0; done
  if [ $ok -eq 0 ]; then cat "$nomove.log"; status=1; fi
}
# Lesson 05: the batches' features and labels left on the host, in training and evaluation.
moves_nothing 05 training_loop.cpp 4 \
  's#^\( *\)\(features\|labels\) = \(features\|labels\)\.to(device);#\1(void)device;#' \
  "stayed on the host"
# Lesson 11: the model (two trainers) and the batch copies (two lines) left on the host.
moves_nothing 11 fast_training_loop.cpp 4 \
  's#^\( *\)trainer\.model->to(device);.*#\1(void)device;#; s#host\.\(images\|labels\)\.to(device_, /\*non_blocking=\*/pinned_)#host.\1#' \
  "moved nothing to the device" "stayed on the host"
exit $status
