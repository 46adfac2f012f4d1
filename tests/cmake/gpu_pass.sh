#!/bin/sh
# gpu_pass.sh ROOT BUILD PYTHON: scripts/gpu-pass rehearsed on the CPU (--device cpu --quick)
# with PYTHON (the one whose torch BUILD links), as a GPU server runs it:
# - first its configure stage in a fresh folder, with the LibTorch found only through the prefix
#   path the pass hands CMake and PYTHON not on the PATH: configure must find PYTHON there;
# - then its run stage (lessons, benchmarks, yardstick, plots) with this build, into a temporary
#   folder; its summary and tarball are checked: every step passed or was waived, and the tarball
#   holds a transcript of each lesson, lesson 16's traces, benchmark JSON and the plots. (The
#   build stage, which rebuilds this build and runs its GPU tests, is left out: it would rewrite
#   this build and its Testing/ files while the suite that runs this test uses them.)
# Also: what the pass refuses (no GPU with --device cuda, a PyTorch without CUDA) exits 2 with a
# HINT. Exit 77 (skipped) when BUILD has no Python with its torch.
set -u
root=$1; build=$2; python=${3:-}
if [ -z "$python" ]; then
  echo "skipped: $build has no Python whose torch is its LibTorch (configure said so)"; exit 77
fi
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fail() { echo "FAILED: $*"; cat "$out/summary.txt" 2>/dev/null; exit 1; }
export GPU_PASS_PYTHON="$python"
# The PATH without PYTHON's virtual environment: a server's venv is not active either.
if [ -f "$(dirname "$python")/activate" ]; then
  PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$(dirname "$python")" | paste -sd: -)
fi

"$root/scripts/gpu-pass" "$out/fresh" --stage configure --device cpu --build-dir "$out/fresh-build"; rc=$?
[ $rc -eq 0 ] || { cat "$out/fresh/summary.txt"; echo "FAILED: configure in a fresh folder exited $rc"; exit 1; }
found=$(sed -n 's/^GPU_LESSONS_PYTHON_TORCH:INTERNAL=//p' "$out/fresh-build/CMakeCache.txt")
[ "$found" = "$python" ] || fail "a fresh configure found the Python '$found', not $python"
rm -rf "$out/fresh-build"

"$root/scripts/gpu-pass" "$out/pass" --stage run --device cpu --quick --build-dir "$build" \
  --deadline 1500; rc=$?
[ $rc -eq 0 ] || fail "gpu-pass exited $rc"
summary=$out/pass/summary.txt
[ -f "$summary" ] || fail "no summary.txt"
! grep -q '^FAIL' "$summary" || fail "a step failed"
for step in transcripts yardstick plots; do
  grep -Eq "^(PASS|WAIVED) +$step " "$summary" || fail "no line for step $step"
done
mkdir "$out/x" && tar -xzf "$out/pass/gpu-pass.tar.gz" -C "$out/x" || fail "the tarball does not unpack"
t=$out/x/gpu-pass
for lesson in "$root"/lessons/[0-9][0-9]_*/; do
  name=lesson$(basename "$lesson")
  grep -Eq "^(PASS|WAIVED) +$name " "$summary" || fail "no summary line for $name"
  [ -s "$t/docs/transcripts/gpu/$name.txt" ] || fail "no transcript of $name"
  grep -q '^RESULT: ' "$t/docs/transcripts/gpu/$name.txt" || fail "$name's transcript has no verdict"
done
for extra in lesson09_data_parallel.2ranks lesson09_data_parallel.torchrun \
             lesson14_distributed_failures.2ranks lesson14_distributed_failures.torchrun \
             lesson10_checkpointing.resume lesson10_checkpointing.roundtrip \
             lesson12_crash_safe_checkpoints.resume; do
  [ -s "$t/docs/transcripts/gpu/$extra.txt" ] || fail "no transcript $extra"
done
for loop in lesson05 lesson11; do  # lesson 16's traces, which --import draws
  grep -q '"traceEvents"' "$t/docs/transcripts/gpu/lesson16_profiling-$loop.json" 2>/dev/null ||
    fail "no trace lesson16_profiling-$loop.json"
done
for lesson in 09_data_parallel 14_distributed_failures; do
  grep -q "RESULT: PASS lesson ${lesson%%_*} rank 0 of 1" "$t/docs/transcripts/gpu/lesson$lesson.torchrun.txt" ||
    fail "torchrun's job of lesson ${lesson%%_*} did not pass"
done
for bench in "$build"/bin/bench_*; do
  json=$t/docs/benchmarks/gpu/$(basename "$bench").json
  grep -q '"benchmarks"' "$json" 2>/dev/null || fail "no JSON from $(basename "$bench")"
done
# The plots, unless the pass waived them (no matplotlib where it ran: --import draws them).
grep -Eq '^WAIVED +plots ' "$summary" || ls "$t"/docs/benchmarks/plots/*-gpu.svg >/dev/null 2>&1 ||
  fail "no plots"
[ -s "$t/summary.txt" ] && [ -d "$t/logs" ] || fail "the tarball lacks the summary or the logs"

# --only: these items alone, in this order, each within its seconds.
"$root/scripts/gpu-pass" "$out/only" --stage run --device cpu --quick --build-dir "$build" \
  --only 'bench_memory:20 lesson01:60' >"$out/only.log" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "--only exited $rc: $(cat "$out/only.log")"
[ "$(grep -E '^PASS +(bench_memory|lesson01) ' "$out/only/summary.txt" | cut -c8-20 | tr -d ' \n')" = \
  bench_memorylesson01 ] || fail "--only did not run bench_memory, then lesson01: $(cat "$out/only/summary.txt")"
! grep -Eq '^[A-Z]+ +(transcripts|yardstick|lesson02) ' "$out/only/summary.txt" ||
  fail "--only ran more than its items: $(cat "$out/only/summary.txt")"
# Refused before anything runs: an unknown item or lesson, seconds that are not a number or under
# 15, --only outside the run stages.
for bad in "run|lesson01:60 banana" "run|lesson01:60 lesson99" "run|lesson01:abc" "run|lesson01:0" \
           "all|lesson01"; do
  "$root/scripts/gpu-pass" "$out/bad" --device cpu --build-dir "$build" --stage "${bad%%|*}" \
    --only "${bad#*|}" >"$out/bad.log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q HINT "$out/bad.log" && ! grep -q '^gpu-pass: lesson01 (at most' "$out/bad.log" ||
    fail "--stage ${bad%%|*} --only '${bad#*|}': exit $rc, or it ran an item first: $(cat "$out/bad.log")"
done

# Refusals: a clear message with a HINT, exit 2.
if ! "$build/bin/lesson01_device_check" --device cuda:0 >/dev/null 2>&1; then
  "$root/scripts/gpu-pass" "$out/nogpu" --device cuda --build-dir "$build" >"$out/nogpu.log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q "no GPU is visible" "$out/nogpu.log" && grep -q HINT "$out/nogpu.log" ||
    fail "--device cuda without a GPU: exit $rc: $(cat "$out/nogpu.log")"
fi
if /usr/bin/python3 -c 'import torch, sys; sys.exit(bool(torch.version.cuda))' 2>/dev/null ||
   ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  GPU_PASS_PYTHON=/usr/bin/python3 "$root/scripts/gpu-pass" "$out/nocuda" --device cpu \
    >"$out/nocuda.log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q HINT "$out/nocuda.log" ||
    fail "a Python without a CUDA torch: exit $rc: $(cat "$out/nocuda.log")"
fi
cat "$summary"
