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

/// Runs `work` once per iteration on `device`, timing each with a synchronize before the clock
/// is read (for benchmarks registered with UseManualTime()). One untimed call warms up first.
void run_timed(benchmark::State& state, const c10::Device& device,
               const std::function<void()>& work);

}  // namespace bench
