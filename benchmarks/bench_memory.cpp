// bench_memory: lesson 07's training step against batch size: time, peak memory and the
// activation bytes kept per sample, on the CPU and the GPU. GPU timings synchronize before
// reading the clock.
//
// Run: build/bin/bench_memory --benchmark_out=memory.json --benchmark_out_format=json
#include <torch/torch.h>

#include "bench.h"
#include "memory/memory.h"
// Lesson 07 is one file with its own main(): its functions, without the main.
#define GPU_LESSONS_NO_MAIN
#include "memory_management.cpp"

namespace {

// ---- step time and peak memory against batch size -----------------------------------------------
void step_memory(benchmark::State& state, const c10::Device& device) {
  course::install_counting_cpu_allocator();
  const std::int64_t batch = state.range(0);
  torch::manual_seed(lesson07::kSeed);
  lesson07::Net model;
  model->to(device);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  lesson07::train_step(model, adam, 8, device);  // Adam's state exists before the measurement
  const lesson07::StepMemory memory = lesson07::measure_step(model, adam, batch, device);
  bench::run_timed(state, device, [&] { lesson07::train_step(model, adam, batch, device); });
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["peak_bytes"] = static_cast<double>(memory.peak);
  state.counters["kept_bytes_per_sample"] = memory.bytes_per_sample();
}

void BM_StepMemoryCpu(benchmark::State& state) { step_memory(state, torch::kCPU); }
void BM_StepMemoryCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) step_memory(state, device);
}

}  // namespace

BENCHMARK(BM_StepMemoryCpu)
    ->ArgName("batch")
    ->RangeMultiplier(4)
    ->Range(64, 4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepMemoryCuda)
    ->ArgName("batch")
    ->RangeMultiplier(4)
    ->Range(64, 4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
