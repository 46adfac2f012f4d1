#!/bin/sh
# lesson09_ranks.sh BINARY CASE [FLAGS...]: runs lesson 09 as a c10d job on this host, the
# way torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK set per process), so
# that CI needs no launcher. Cases:
#   two-ranks      two ranks, --quick: both exit 0 with RESULT: PASS
#   rank-killed    rank 1 is killed (SIGKILL) mid-training: rank 0 exits non-zero, saying so,
#                  within the timeout (and no hang)
#   never-arrives  rank 0 alone in a job of two: exits 2 with a HINT within the timeout
set -u
bin=$1; case=$2; shift 2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
       || echo $((20000 + $$ % 20000)))
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
fail() { echo "FAILED: $*"; for f in "$out"/*; do echo "---- $f"; cat "$f"; done; exit 1; }
timeout=20
case $case in
  two-ranks)
    RANK=0 LOCAL_RANK=0 "$bin" --quick --timeout $timeout "$@" >"$out/rank0" 2>&1 & p0=$!
    RANK=1 LOCAL_RANK=1 "$bin" --quick --timeout $timeout "$@" >"$out/rank1" 2>&1 & p1=$!
    wait $p0; r0=$?; wait $p1; r1=$?
    [ $r0 -eq 0 ] && [ $r1 -eq 0 ] || fail "exit codes $r0 and $r1"
    for r in 0 1; do
      grep -q "RESULT: PASS lesson 09 rank $r of 2" "$out/rank$r" || fail "rank $r: no PASS line"
      grep -q "across 2 ranks: all equal" "$out/rank$r" || fail "rank $r: checksums"
    done
    cat "$out/rank0" ;;
  rank-killed)
    RANK=0 LOCAL_RANK=0 "$bin" --epochs 50 --timeout $timeout "$@" >"$out/rank0" 2>&1 & p0=$!
    RANK=1 LOCAL_RANK=1 "$bin" --epochs 50 --timeout $timeout "$@" >"$out/rank1" 2>&1 & p1=$!
    i=0
    until grep -q "epoch 1/50" "$out/rank1" 2>/dev/null; do
      i=$((i + 1)); [ $i -lt 600 ] || { kill -9 $p0 $p1; fail "rank 1 never finished epoch 1"; }
      sleep 0.1
    done
    kill -9 $p1; start=$(date +%s)
    wait $p0; r0=$?; took=$(( $(date +%s) - start ))
    [ $r0 -ne 0 ] || fail "rank 0 exited 0 after its peer died"
    [ $took -le $timeout ] || fail "rank 0 took ${took}s (timeout ${timeout}s)"
    grep -q "lost the job" "$out/rank0" || fail "rank 0 did not say it lost the job"
    grep -q "RESULT: FAIL" "$out/rank0" || fail "rank 0 printed no FAIL verdict"
    echo "rank 0 exited $r0 ${took}s after rank 1 was killed"; tail -4 "$out/rank0" ;;
  never-arrives)
    start=$(date +%s)
    RANK=0 LOCAL_RANK=0 "$bin" --quick --timeout 3 "$@" >"$out/rank0" 2>&1; r0=$?
    took=$(( $(date +%s) - start ))
    [ $r0 -eq 2 ] || fail "exit code $r0, expected 2"
    grep -q "HINT:" "$out/rank0" || fail "no HINT"
    [ $took -le 60 ] || fail "took ${took}s"
    echo "rank 0 gave up after ${took}s"; tail -2 "$out/rank0" ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
