#!/bin/sh
# labs_graded.sh ROOT LAB_BUILD_DIR FLAVOUR: for every lab scripts/make-labs makes from ROOT's
# lessons, the untouched starter builds and fails scripts/grade-lab (exit 1: built, some check
# failed); lesson 05's own folder passes it (exit 0). So the grader can neither pass an empty answer nor fail a right one. (The
# grader runs a lesson's own tests, the same for every lab: lessonNN.*, smoke and cli; each
# lesson passes them in the suite this test belongs to, so one lesson graded shows the passing
# path, and the ten other builds of lessons as they are would repeat the suite's.) And labs 05
# and 11 done but for their moves (the batches, and in 11 the model, stay on the host) fail,
# saying so: on a CPU-only machine, where such a submission still trains.
set -u
root=$1
export LAB_BUILD_DIR=$2 GPU_LESSONS_TORCH=$3
# clang, where it is installed (the debian flavour's compiler), builds the labs in less than half
# the time g++ takes; CMake takes CXX for a new build folder.
if command -v clang++ >/dev/null; then export CXX=clang++; fi
status=0
# grade NN FOLDER WANT WHAT [PATTERN...]: grade-lab NN FOLDER ("": the starter) exits WANT, and
# its output holds every PATTERN.
grade() {
  nn=$1 folder=$2 want=$3 what=$4
  shift 4
  log=$LAB_BUILD_DIR.$nn.$what.log
  "$root/scripts/grade-lab" "$nn" ${folder:+"$folder"} >"$log" 2>&1
  code=$?
  echo "lab $nn: $what exit $code (want $want): $(tail -1 "$log")"
  ok=1
  [ "$code" -eq "$want" ] || ok=0
  for pattern in "$@"; do grep -q "$pattern" "$log" || ok=0; done
  if [ $ok -eq 0 ]; then cat "$log"; status=1; fi
}
rm -rf "$LAB_BUILD_DIR/starters"
"$root/scripts/make-labs" "$LAB_BUILD_DIR/starters" || exit 1
for lab in "$LAB_BUILD_DIR"/starters/[0-9][0-9]_*/; do
  grade "$(basename "$lab" | cut -c1-2)" "" 1 starter
done
grade 05 "$root/lessons/05_training_loop" 0 lesson
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
  grade "$nn" "$nomove" 1 moving-nothing "$@"
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
