// bench_precision: fp32 against autocast (bf16, fp16) for a matmul and a training step (lesson
// 08's wide model), on the CPU and the GPU. The autocast matmul times what a model under autocast
// pays: the casts of both fp32 inputs and the matmul; on the GPU the matmul alone, its inputs
// already in the precision, is timed too. GPU timings synchronize before reading the clock.
//
// Run: build/bin/bench_precision --benchmark_out=precision.json --benchmark_out_format=json
#include <optional>

#include <torch/torch.h>

#include "bench.h"
#include "mixed_precision.h"

namespace {

// Precision argument: 0 = fp32, 1 = bf16, 2 = fp16. The CPU variants stop at bf16: LibTorch
// 1.13's CPU autocast supports bf16 alone.
const char* kPrecisions[] = {"fp32", "bf16", "fp16"};

// ---- matmul: fp32 against autocast ------------------------------------------------------------------
void matmul(benchmark::State& state, const c10::Device& device) {
  state.SetLabel(kPrecisions[state.range(0)]);
  const std::int64_t n = state.range(1);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor a = torch::randn({n, n}, on);
  const torch::Tensor b = torch::randn({n, n}, on);
  const torch::ScalarType low = lesson08::precision_dtype(kPrecisions[state.range(0)]);
  bench::run_timed(state, device, [&] {
    std::optional<lesson08::Autocast> autocast;
    if (state.range(0) != 0) autocast.emplace(device.type(), low);
    torch::mm(a, b);  // under autocast: casts a and b, multiplies in 16 bits
  });
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AutocastMatmulCpu(benchmark::State& state) { matmul(state, torch::kCPU); }
void BM_AutocastMatmulCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) matmul(state, device);
}

// ---- the matmul alone, its inputs already in the precision (no casts timed) ----------------------
void BM_MatmulInPrecisionCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (!bench::gpu_or_skip(state, device)) return;
  state.SetLabel(kPrecisions[state.range(0)]);
  const std::int64_t n = state.range(1);
  const auto on = torch::TensorOptions().device(device).dtype(
      lesson08::precision_dtype(kPrecisions[state.range(0)]));
  const torch::Tensor a = torch::randn({n, n}, on);
  const torch::Tensor b = torch::randn({n, n}, on);
  torch::Tensor c = torch::empty({n, n}, on);
  bench::run_timed(state, device, [&] { torch::mm_out(c, a, b); });
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- a training step: fp32 against autocast ------------------------------------------------------------
void mixed_step(benchmark::State& state, const c10::Device& device) {
  state.SetLabel(kPrecisions[state.range(0)]);
  const std::int64_t batch = state.range(1);
  const std::string precision = kPrecisions[state.range(0)];
  torch::manual_seed(lesson08::kSeed);
  lesson08::Mlp model(lesson08::kWide.hidden1, lesson08::kWide.hidden2);
  model->to(device);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  lesson08::GradScaler scaler(device);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::rand({batch, 784}, on);
  const torch::Tensor y = torch::randint(10, {batch}, on.dtype(torch::kLong));
  bench::run_timed(state, device, [&] {
    lesson08::train_step(model, adam, scaler, precision, x, y);
  });
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_MixedStepCpu(benchmark::State& state) { mixed_step(state, torch::kCPU); }
void BM_MixedStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) mixed_step(state, device);
}

}  // namespace

BENCHMARK(BM_AutocastMatmulCpu)->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1}, {256, 1024, 2048}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AutocastMatmulCuda)->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1, 2}, {256, 1024, 4096}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulInPrecisionCuda)->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1, 2}, {256, 1024, 4096}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixedStepCpu)->ArgNames({"precision", "batch"})
    ->ArgsProduct({{0, 1}, {64, 256, 1024}})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixedStepCuda)->ArgNames({"precision", "batch"})
    ->ArgsProduct({{0, 1, 2}, {64, 256, 1024}})->UseManualTime()->Unit(benchmark::kMillisecond);
