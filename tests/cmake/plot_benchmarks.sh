#!/bin/sh
# plot_benchmarks.sh SCRIPTS DOCS: scripts/plot-benchmarks draws the recorded CPU benchmark JSON
# (DOCS/benchmarks/cpu) as its charts; a JSON file cut short (a run stopped while writing it) is
# named, its charts are left out, the others are still drawn, and the exit is 1 with a HINT.
# Exit 77 (skipped) without matplotlib in /usr/bin/python3.
set -u
scripts=$1; docs=$2
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  { echo "no matplotlib in /usr/bin/python3 (apt-get install python3-matplotlib)"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/all/cpu" "$tmp/cut/cpu"
cp "$docs"/benchmarks/cpu/*.json "$tmp/all/cpu/" && cp "$docs"/benchmarks/cpu/*.json "$tmp/cut/cpu/" ||
  { echo "no recorded JSON in $docs/benchmarks/cpu"; exit 1; }

/usr/bin/python3 "$scripts/plot-benchmarks" --all "$tmp/all" > "$tmp/all.log" 2>&1 ||
  { cat "$tmp/all.log"; echo "FAILED: the recorded JSON did not draw"; exit 1; }
drawn=$(ls "$tmp"/all/plots/*.svg | wc -l)
[ "$drawn" -ge 3 ] || { cat "$tmp/all.log"; echo "FAILED: $drawn charts drawn"; exit 1; }

head -c 2000 "$docs/benchmarks/cpu/bench_training.json" > "$tmp/cut/cpu/bench_training.json"
/usr/bin/python3 "$scripts/plot-benchmarks" --all "$tmp/cut" > "$tmp/cut.log" 2>&1; rc=$?
cat "$tmp/cut.log"
[ $rc -eq 1 ] || { echo "FAILED: a cut JSON exited $rc, not 1"; exit 1; }
grep -q "cannot read .*bench_training.json" "$tmp/cut.log" && grep -q HINT "$tmp/cut.log" ||
  { echo "FAILED: the cut file or the HINT is not named"; exit 1; }
! grep -q Traceback "$tmp/cut.log" || { echo "FAILED: a traceback"; exit 1; }
[ ! -e "$tmp/cut/plots/training.svg" ] || { echo "FAILED: a chart from the cut file"; exit 1; }
left=$(ls "$tmp"/cut/plots/*.svg | wc -l)
[ "$left" -eq $((drawn - 1)) ] ||
  { echo "FAILED: $left charts besides the cut file's, not $((drawn - 1))"; exit 1; }
echo "PASS: $drawn charts; with bench_training.json cut, $left"
