// bench_profiler: what LibTorch's profiler costs (lesson 20). Lesson 05's step as lesson 20 writes
// it (LibTorch's data loader, the batch moved to the device, .item() at every step, the named
// ranges), in samples/s, with the profiler off and on (recording input shapes, as lesson 20
// does). One step per iteration; the step's .item() waits for the device, so the clock reads
// finished work on a GPU too. The profile's own ending (sorting its events) is not timed.
//
// Run: build/bin/bench_profiler --benchmark_out=profiler.json --benchmark_out_format=json
#include <torch/torch.h>

#include "bench.h"
// Lesson 20 is one file with its own main(); the benchmark includes it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "profiling.cpp"

namespace {

void profiled_step(benchmark::State& state, const torch::Device& device) {
  static const course::FashionMNIST train("", /*train=*/true);  // loaded once, as a lesson does
  lesson20::TutorialLoop loop = lesson20::make_tutorial_loop(train, device);
  lesson20::tutorial_steps(loop, lesson20::kWarmupSteps, device);
  const auto steps = [&] {
    for (auto _ : state) lesson20::tutorial_steps(loop, 1, device);
  };
  if (state.range(0) != 0) {
    lesson20::profile(steps, device);  // every step under one profile, as the lesson's
  } else {
    steps();
  }
  state.SetItemsProcessed(state.iterations() * lesson20::kBatchSize);
}

void BM_ProfiledStepCpu(benchmark::State& state) { profiled_step(state, torch::kCPU); }

void BM_ProfiledStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) profiled_step(state, device);
}

}  // namespace

// Nine repetitions (whatever --benchmark_repetitions says): a step's time varies from run to run
// by more than the profiler's cost, so the medians need more runs than the other benchmarks'.
BENCHMARK(BM_ProfiledStepCpu)
    ->ArgName("profiler")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Repetitions(9)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ProfiledStepCuda)
    ->ArgName("profiler")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Repetitions(9)
    ->Unit(benchmark::kMillisecond);
