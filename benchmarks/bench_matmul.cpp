// bench_matmul: fp32 matmul on the CPU against the GPU over sizes 64..4096, host-to-device
// copies from pageable against pinned memory, and lesson 03's sum of squares three ways (a loop
// with .item(), a loop over an accessor, one tensor op). GPU timings synchronize before reading
// the clock.
//
// Run: build/bin/bench_matmul --benchmark_out=matmul.json --benchmark_out_format=json
#include <torch/torch.h>

#include "bench.h"
// Lesson 03 is one file with its own main(): its functions, without the main.
#define GPU_LESSONS_NO_MAIN
#include "moving_tensors.cpp"

namespace {

// ---- fp32 matmul -------------------------------------------------------------------------------
void matmul(benchmark::State& state, const c10::Device& device) {
  const std::int64_t n = state.range(0);
  const auto options = torch::TensorOptions().device(device);
  const torch::Tensor a = torch::randn({n, n}, options);
  const torch::Tensor b = torch::randn({n, n}, options);
  torch::Tensor c = torch::empty({n, n}, options);
  bench::run_timed(state, device, [&] { torch::mm_out(c, a, b); });
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MatmulCpu(benchmark::State& state) { matmul(state, torch::kCPU); }

void BM_MatmulCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) matmul(state, device);
}

// ---- host-to-device copies ---------------------------------------------------------------------
void BM_CopyHostToDevice(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (!bench::gpu_or_skip(state, device)) return;
  const std::int64_t bytes = state.range(0);
  const bool pinned = state.range(1) != 0;
  torch::Tensor host = torch::ones({bytes / 4});
  if (pinned) host = host.pin_memory();
  torch::Tensor target = torch::empty({bytes / 4}, torch::TensorOptions().device(device));
  bench::run_timed(state, device, [&] { target.copy_(host, /*non_blocking=*/pinned); });
  state.SetBytesProcessed(state.iterations() * bytes);
}

// ---- lesson 03: one computation, three ways -----------------------------------------------------
const char* kWays[] = {"item loop", "accessor loop", "tensor op"};

void sum_of_squares(benchmark::State& state, const c10::Device& device) {
  const int way = static_cast<int>(state.range(0));
  const std::int64_t n = state.range(1);
  state.SetLabel(kWays[way]);
  const torch::Tensor x = torch::rand({n}).to(device);
  bench::run_timed(state, device, [&] {
    if (way == 0) benchmark::DoNotOptimize(lesson03::sum_of_squares_item_loop(x));
    if (way == 1) benchmark::DoNotOptimize(lesson03::sum_of_squares_accessor_loop(x));
    if (way == 2) benchmark::DoNotOptimize(lesson03::sum_of_squares_vectorized(x));
  });
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_SumOfSquaresCpu(benchmark::State& state) { sum_of_squares(state, torch::kCPU); }
void BM_SumOfSquaresCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) sum_of_squares(state, device);
}

}  // namespace

BENCHMARK(BM_SumOfSquaresCpu)
    ->ArgNames({"way", "n"})
    ->ArgsProduct({{0, 1, 2}, {1000, 10000}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SumOfSquaresCuda)
    ->ArgNames({"way", "n"})
    ->ArgsProduct({{0, 1, 2}, {1000, 10000}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulCpu)
    ->ArgName("n")
    ->RangeMultiplier(2)
    ->Range(64, 4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulCuda)
    ->ArgName("n")
    ->RangeMultiplier(2)
    ->Range(64, 4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CopyHostToDevice)
    ->ArgNames({"bytes", "pinned"})
    ->ArgsProduct({{1 << 20, 16 << 20, 256 << 20}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
