#!/bin/sh
# lesson16_trace.sh LESSON16 SCRIPTS: lesson 16's --trace FILE writes two Chrome traces that parse
# as JSON, each with complete events ("ph": "X") for every profiled step's ranges, which
# scripts/plot-trace draws as one timeline picture; an unwritable --trace exits 2 with a HINT.
# Exit 77 (skipped) when all that passed but there was no matplotlib to draw the picture.
lesson=$1 scripts=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
"$lesson" --quick --device cpu --trace "$tmp/trace.json" > "$tmp/out.txt" 2>&1 || {
  tail -20 "$tmp/out.txt"; echo "lesson 16 failed"; exit 1; }
for loop in lesson05 lesson11; do
  python3 - "$tmp/trace-$loop.json" <<'PY' || exit 1
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
ranges = [e for e in events if e.get("ph") == "X" and e.get("name") in ("forward", "backward", "optimizer.step")]
steps = 3  # lesson 16's kQuickSteps
if len(ranges) != 3 * steps:
    sys.exit(f"{sys.argv[1]}: {len(ranges)} ranges of the three parts, expected {3 * steps}")
print(f"{sys.argv[1]}: {len(events)} events, {len(ranges)} ranges")
PY
done
skip=0  # the picture needs matplotlib (set-up installs it; a GPU server may lack it)
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  "$scripts/plot-trace" "$tmp/timeline.png" "$tmp/trace-lesson05.json" "$tmp/trace-lesson11.json" \
    --titles "lesson 05's loop" "lesson 11's loop" || exit 1
  head -c 8 "$tmp/timeline.png" | grep -q PNG || { echo "plot-trace drew no PNG"; exit 1; }
else
  echo "no matplotlib in /usr/bin/python3: the picture is not drawn (apt-get install python3-matplotlib)"
  skip=1
fi
out=$("$lesson" --quick --device cpu --trace "$tmp/no-such-folder/trace.json" 2>&1)
code=$?
[ $code -eq 2 ] && printf '%s\n' "$out" | grep -q '^HINT:' || {
  printf '%s\n' "$out" | tail -5; echo "an unwritable --trace exited $code, expected 2 with a HINT"; exit 1; }
[ $skip -eq 0 ] || exit 77  # the rest passed; the picture was skipped
