#!/bin/sh
# run_benchmarks.sh SCRIPTS BUILD: scripts/run-benchmarks --budget runs every program's cases once,
# then again with repetitions while time is left, and each JSON says how many repetitions it
# holds; --programs runs the programs named alone; a budget too small for any program names them
# all and exits 1.
set -u
scripts=$1; build=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
filter=--benchmark_filter=PeakMatmulCpu/precision:0/
BUILD_DIR=$build "$scripts/run-benchmarks" "$tmp/ok" --budget 120 --programs bench_scaling -- "$filter" \
  > "$tmp/ok.log" 2>&1 ||
  { cat "$tmp/ok.log"; echo "FAILED: a budget of 120 s did not pass"; exit 1; }
grep -q '"name": "BM_PeakMatmulCpu/precision:0/n:2048/manual_time_median"' "$tmp/ok/bench_scaling.json" &&
  grep -q '"repetitions_asked": "3"' "$tmp/ok/bench_scaling.json" ||
  { cat "$tmp/ok.log"; echo "FAILED: bench_scaling.json lacks the case's median of 3 repetitions"; exit 1; }
ls "$tmp/ok"/*.part 2>/dev/null && { echo "FAILED: part files left"; exit 1; }
[ "$(ls "$tmp/ok"/*.json | wc -l)" -eq 1 ] ||
  { ls "$tmp/ok"; echo "FAILED: --programs bench_scaling ran other programs too"; exit 1; }
for bad in bench_nothing lesson01_device_check ""; do
  BUILD_DIR=$build "$scripts/run-benchmarks" "$tmp/no" --programs "$bad" > "$tmp/no.log" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q HINT "$tmp/no.log" ||
    { cat "$tmp/no.log"; echo "FAILED: --programs '$bad' exited $rc without a HINT"; exit 1; }
done
BUILD_DIR=$build "$scripts/run-benchmarks" "$tmp/none" --budget 1 -- "$filter" > "$tmp/none.log" 2>&1
rc=$?
cat "$tmp/none.log"
[ $rc -eq 1 ] && grep -q "bench_scaling (no time left)" "$tmp/none.log" ||
  { echo "FAILED: a budget of 1 s exited $rc without naming the programs left out"; exit 1; }
echo "PASS: every case once, then 3 repetitions; only the programs named; no time names what did not run"
