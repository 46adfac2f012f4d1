#!/bin/sh
# job_ranks.sh BINARY CASE [FLAGS...]: runs lesson 09 or lesson 14 (BINARY) as a c10d job on this
# host, the way torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK set per
# process), so that CI needs no launcher. Cases, for both lessons unless said:
#   two-ranks      two ranks, --quick: both exit 0 with RESULT: PASS and the same parameters
#   two-ranks-kernels  two ranks pass with the BLAS kernels for other CPUs forced (lesson 14:
#                  its summed-gradient check holds with each)
#   rank-killed    rank 1 is killed (SIGKILL) mid-training: rank 0 exits non-zero, saying so,
#                  within the timeout (and no hang)
#   never-arrives  rank 0 alone in a job of two: exits 2 with the rendezvous' message and a HINT,
#                  after one --timeout (not two); lesson 14 says how many ranks arrived
# On a GPU (LESSON01 names lesson 01's binary, which counts the GPUs; exit 77, skipped, without
# enough of them):
#   nccl-one-rank      a job of one on NCCL (--device cuda): PASS, the group formed (lesson 14:
#                      connected) and shut down (no warning that it was not destroyed)
#   nccl-rank-killed   lesson 14: two NCCL ranks, one GPU each, rank 1 killed: rank 0 exits 1 with
#                      its own error within the timeout (not NCCL's watchdog's SIGABRT); 2 GPUs
#   too-few-gpus       lesson 14: one rank more than there are GPUs: --device cuda exits 2 on
#                      every rank; --device auto trains every rank on the CPU and passes
#   same-gpu           lesson 14: two ranks given the same GPU (CUDA_VISIBLE_DEVICES=0 for both):
#                      both exit 2, saying they share one GPU
set -u
bin=$1; case=$2; shift 2
lesson=$(basename "$bin" | sed 's/^lesson\([0-9]*\)_.*/\1/')
gpus=0
if [ -n "${LESSON01:-}" ]; then
  gpus=$("$LESSON01" --device cpu 2>/dev/null | sed -n 's/.*| GPUs: \([0-9]*\).*/\1/p')
fi
need_gpus() { [ "${gpus:-0}" -ge "$1" ] || { echo "needs $1 GPU(s), found ${gpus:-0}"; exit 77; }; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + ($$ + ${1:-0}) % 20000))
}
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
fail() { echo "FAILED: $*"; for f in "$out"/*; do echo "---- $f"; cat "$f"; done; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }  # milliseconds since the epoch
checksum() { sed -n 's/^parameter checksum \([0-9a-f]*\).*/\1/p' "$1"; }
timeout=20
case $case in
  two-ranks)
    RANK=0 LOCAL_RANK=0 "$bin" --quick --timeout $timeout "$@" >"$out/rank0" 2>&1 & p0=$!
    RANK=1 LOCAL_RANK=1 "$bin" --quick --timeout $timeout "$@" >"$out/rank1" 2>&1 & p1=$!
    wait $p0; r0=$?; wait $p1; r1=$?
    [ $r0 -eq 0 ] && [ $r1 -eq 0 ] || fail "exit codes $r0 and $r1"
    for r in 0 1; do
      grep -q "RESULT: PASS lesson $lesson rank $r of 2" "$out/rank$r" || fail "rank $r: no PASS line"
    done
    [ -n "$(checksum "$out/rank0")" ] && [ "$(checksum "$out/rank0")" = "$(checksum "$out/rank1")" ] ||
      fail "the ranks' parameter checksums differ"
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
    start=$(now_ms)
    RANK=0 LOCAL_RANK=0 "$bin" --quick --timeout 5 "$@" >"$out/rank0" 2>&1; r0=$?
    took_ms=$(( $(now_ms) - start ))
    [ $r0 -eq 2 ] || fail "exit code $r0, expected 2"
    if [ "$lesson" = 14 ]; then
      grep -q "gave up waiting for the other ranks.*1 of 2 arrived" "$out/rank0" || fail "not the rendezvous' message"
    else
      grep -q "could not join the job" "$out/rank0" || fail "not the group's message"
    fi
    grep -q "HINT:" "$out/rank0" || fail "no HINT"
    # One wait of --timeout, plus start-up (loading the data): not before the timeout (in
    # milliseconds: 5.0 s is a whole wait), not a second timeout after it.
    [ $took_ms -lt 5000 ] && fail "gave up after ${took_ms} ms, before the timeout of 5 s"
    [ $took_ms -le 15000 ] || fail "took ${took_ms} ms with --timeout 5"
    echo "rank 0 gave up after ${took_ms} ms"; tail -2 "$out/rank0" ;;
  two-ranks-kernels)
    # Two ranks pass on this CPU with the BLAS's kernels for other CPUs forced, each of which
    # rounds a matrix product differently (OpenBLAS: Debian's flavour; MKL: the 2.11 wheel's).
    for kernels in "OPENBLAS_CORETYPE=Sandybridge MKL_ENABLE_INSTRUCTIONS=AVX2" \
                   "OPENBLAS_CORETYPE=Prescott MKL_ENABLE_INSTRUCTIONS=SSE4_2"; do
      port=$(free_port 1)
      for r in 0 1; do
        env $kernels MASTER_PORT=$port RANK=$r LOCAL_RANK=$r "$bin" --quick --timeout $timeout "$@" \
          >"$out/rank$r" 2>&1 &
        eval p$r=\$!
      done
      wait $p0; r0=$?; wait $p1; r1=$?
      [ $r0 -eq 0 ] && [ $r1 -eq 0 ] || fail "$kernels: exit codes $r0 and $r1"
      [ "$(checksum "$out/rank0")" = "$(checksum "$out/rank1")" ] || fail "$kernels: checksums differ"
      if [ "$lesson" = 14 ]; then
        grep -q "summed gradient vs one process's" "$out/rank0" || fail "$kernels: no gradient check"
        echo "$kernels: both ranks pass"; grep "summed gradient" "$out/rank0"
      else
        echo "$kernels: both ranks pass"; grep "parameter checksum" "$out/rank0"
      fi
    done ;;
  nccl-one-rank)
    need_gpus 1
    WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$bin" --quick --timeout 60 --device cuda \
      >"$out/rank0" 2>&1; r0=$?
    [ $r0 -eq 0 ] || fail "exit code $r0"
    grep -q "nccl group of 1 \(formed\|connected\)" "$out/rank0" || fail "no NCCL group"
    grep -q "RESULT: PASS lesson $lesson rank 0 of 1 on cuda:0" "$out/rank0" || fail "no PASS line"
    ! grep -qi "destroy_process_group\|not been destroyed" "$out/rank0" || fail "group not shut down"
    cat "$out/rank0" ;;
  nccl-rank-killed)
    need_gpus 2
    RANK=0 LOCAL_RANK=0 "$bin" --epochs 50 --timeout $timeout --device cuda >"$out/rank0" 2>&1 & p0=$!
    RANK=1 LOCAL_RANK=1 "$bin" --epochs 50 --timeout $timeout --device cuda >"$out/rank1" 2>&1 & p1=$!
    i=0
    until grep -q "epoch 1/50" "$out/rank1" 2>/dev/null; do
      i=$((i + 1)); [ $i -lt 1200 ] || { kill -9 $p0 $p1; fail "rank 1 never finished epoch 1"; }
      sleep 0.1
    done
    kill -9 $p1; start=$(date +%s)
    wait $p0; r0=$?; took=$(( $(date +%s) - start ))
    [ $r0 -eq 1 ] || fail "rank 0 exited $r0 (1 expected; 134 is NCCL's watchdog aborting)"
    [ $took -le $((timeout + 15)) ] || fail "rank 0 took ${took}s (timeout ${timeout}s)"
    grep -q "lost the job" "$out/rank0" || fail "rank 0 did not say it lost the job"
    echo "rank 0 exited $r0 ${took}s after rank 1 was killed"; tail -4 "$out/rank0" ;;
  too-few-gpus)
    need_gpus 1
    n=$((gpus + 1)); export WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n
    pids=""; r=0
    while [ $r -lt $n ]; do
      RANK=$r LOCAL_RANK=$r "$bin" --quick --timeout $timeout --device cuda >"$out/cuda$r" 2>&1 &
      pids="$pids $!"; r=$((r + 1))
    done
    for p in $pids; do wait $p; rc=$?; [ $rc -eq 2 ] || fail "--device cuda: a rank exited $rc, 2 expected"; done
    grep -q "NCCL needs a GPU for every rank" "$out/cuda0" || fail "no reason given"
    pids=""; r=0
    while [ $r -lt $n ]; do
      RANK=$r LOCAL_RANK=$r "$bin" --quick --timeout 120 --device auto >"$out/auto$r" 2>&1 &
      pids="$pids $!"; r=$((r + 1))
    done
    for p in $pids; do wait $p; rc=$?; [ $rc -eq 0 ] || fail "--device auto: a rank exited $rc"; done
    grep -q "every rank trains on the CPU" "$out/auto0" || fail "no reason printed"
    grep -q "gloo group of $n connected" "$out/auto0" || fail "not a Gloo group"
    echo "$n ranks for $gpus GPU(s): cuda refused on every rank, auto trained on the CPU" ;;
  same-gpu)
    need_gpus 1
    for r in 0 1; do
      CUDA_VISIBLE_DEVICES=0 RANK=$r LOCAL_RANK=$r "$bin" --quick --timeout $timeout --device auto \
        >"$out/rank$r" 2>&1 &
      eval p$r=\$!
    done
    wait $p0; r0=$?; wait $p1; r1=$?
    [ $r0 -eq 2 ] && [ $r1 -eq 2 ] || fail "exit codes $r0 and $r1, 2 expected"
    for r in 0 1; do grep -q "share one GPU" "$out/rank$r" || fail "rank $r: no reason"; done
    tail -2 "$out/rank0" ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
