#!/bin/sh
# labs_graded.sh ROOT LAB_BUILD_DIR FLAVOUR: for every lab in ROOT/labs, the untouched starter
# builds and fails scripts/grade-lab (exit 1: built, some check failed), and the lesson's own folder
# passes it (exit 0). So the grader can neither pass an empty answer nor fail a right one.
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
exit $status
