// bench_precision: fp32 against autocast (bf16, fp16) for a matmul and a training step (lesson
// 08's AMP loop on a wide model), on the CPU and the GPU. The autocast matmul times what a model
// under autocast pays: the casts of both fp32 inputs and the matmul; on the GPU the matmul alone,
// its inputs already in the precision, is timed too. GPU timings synchronize before reading the
// clock.
//
// Run: build/bin/bench_precision --benchmark_out=precision.json --benchmark_out_format=json
#include <torch/torch.h>

#include <vector>

#include "autocast.h"  // defines: Autocast
#include "bench.h"
#include "grad_scaler.h"  // defines: GradScaler

// The lesson is one file with its own main(); the benchmark includes it for its AMP loop.
#define GPU_LESSONS_NO_MAIN
#include "mixed_precision.cpp"

namespace {

// Precision argument: 0 = fp32, 1 = bf16, 2 = fp16. The CPU variants stop at bf16: LibTorch
// 1.13's CPU autocast supports bf16 alone.
const char* kPrecisions[] = {"fp32", "bf16", "fp16"};
const torch::ScalarType kDtypes[] = {torch::kFloat, torch::kBFloat16, torch::kHalf};

// A model whose step is mostly matmuls, where 16 bits can pay: 784-1024-1024-10.
struct WideImpl : torch::nn::Module {
  WideImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 1024))),
        fc2(register_module("fc2", torch::nn::Linear(1024, 1024))),
        out(register_module("out", torch::nn::Linear(1024, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.view({x.size(0), -1})));
    return out(torch::relu(fc2(x)));
  }
  torch::nn::Linear fc1, fc2, out;
};
TORCH_MODULE(Wide);

// ---- matmul: fp32 against autocast --------------------------------------------------------------
void matmul(benchmark::State& state, const c10::Device& device) {
  state.SetLabel(kPrecisions[state.range(0)]);
  const std::int64_t n = state.range(1);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor a = torch::randn({n, n}, on);
  const torch::Tensor b = torch::randn({n, n}, on);
  const torch::ScalarType low = state.range(0) == 2 ? torch::kHalf : torch::kBFloat16;
  bench::run_timed(state, device, [&] {
    lesson08::Autocast autocast(device.type(), low, /*enabled=*/state.range(0) != 0);
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

// ---- the matmul alone, its inputs already in the precision (no casts timed) ---------------------
void BM_MatmulInPrecisionCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (!bench::gpu_or_skip(state, device)) return;
  state.SetLabel(kPrecisions[state.range(0)]);
  const std::int64_t n = state.range(1);
  const auto on = torch::TensorOptions().device(device).dtype(kDtypes[state.range(0)]);
  const torch::Tensor a = torch::randn({n, n}, on);
  const torch::Tensor b = torch::randn({n, n}, on);
  torch::Tensor c = torch::empty({n, n}, on);
  bench::run_timed(state, device, [&] { torch::mm_out(c, a, b); });
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- a training step: fp32 against autocast -----------------------------------------------------
// One step of lesson 08's AMP loop (train_epoch over a list of one batch already on the device):
// autocast off for fp32, the scaler on for fp16 only.
void mixed_step(benchmark::State& state, const c10::Device& device) {
  state.SetLabel(kPrecisions[state.range(0)]);
  const std::int64_t batch = state.range(1);
  const bool use_amp = state.range(0) != 0;
  const torch::ScalarType dtype = state.range(0) == 2 ? torch::kHalf : torch::kBFloat16;
  torch::manual_seed(lesson08::kSeed);
  Wide model;
  model->to(device);
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(lesson08::kLearningRate));
  lesson08::GradScalerOptions options;
  options.enabled = state.range(0) == 2;
  lesson08::GradScaler scaler(device, options);
  const auto on = torch::TensorOptions().device(device);
  std::vector<torch::data::Example<>> one_batch{
      {torch::rand({batch, 784}, on), torch::randint(10, {batch}, on.dtype(torch::kLong))}};
  bench::run_timed(state, device, [&] {
    lesson08::train_epoch(model, one_batch, criterion, adam, scaler, device, dtype, use_amp);
  });
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_MixedStepCpu(benchmark::State& state) { mixed_step(state, torch::kCPU); }
void BM_MixedStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) mixed_step(state, device);
}

}  // namespace

BENCHMARK(BM_AutocastMatmulCpu)
    ->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1}, {256, 1024, 2048}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AutocastMatmulCuda)
    ->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1, 2}, {256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulInPrecisionCuda)
    ->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1, 2}, {256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixedStepCpu)
    ->ArgNames({"precision", "batch"})
    ->ArgsProduct({{0, 1}, {64, 256, 1024}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixedStepCuda)
    ->ArgNames({"precision", "batch"})
    ->ArgsProduct({{0, 1, 2}, {64, 256, 1024}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
