// bench.h defines: helpers shared by the benchmark programs (GPU availability, honest GPU
// timing with synchronization, FLOP counters).
#pragma once

#include <benchmark/benchmark.h>
#include <c10/core/Device.h>

#include <chrono>
#include <functional>

namespace bench {

/// The first GPU, or nullopt-like CPU device when there is none; skips `state` in that case.
bool gpu_or_skip(benchmark::State& state, c10::Device& device);

/// Times `work` on `device` for benchmarks registered with UseManualTime(), after one untimed
/// call (warm-up: kernel choice, allocator caches, lazy initialization). The CPU: one call per
/// iteration. CUDA: work is queued, so the clock is read only after a synchronize, and one
/// call per synchronize would time a small kernel's launch and the synchronize itself (tens of
/// microseconds) rather than the work. So the clock is read once per `calls_per_sync` calls,
/// run back to back as a training loop queues them, after one synchronize; an iteration is one
/// call, and the time reported is the time per call. 0 picks the count whose calls last at least
/// a millisecond together (at most 1024). The JSON's `calls_per_sync` counter says what was used.
/// Callers that must make the same number of calls on every thread (collectives) pass a fixed
/// count.
void run_timed(benchmark::State& state, const c10::Device& device,
               const std::function<void()>& work, int calls_per_sync = 0);

}  // namespace bench
