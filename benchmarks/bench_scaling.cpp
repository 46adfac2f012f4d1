// bench_scaling: where the GPU wins. One training step (forward, cross-entropy, backward, Adam)
// of the tutorial's MLP shape widened, 784-W-W/2-10 (W = 128 is the tutorial's ANN), as the
// width W and the batch grow, in fp32, TF32 (CUDA) and bf16 autocast, on the CPU and the GPU of
// the same machine: samples/s and achieved FLOP/s, beside the device's measured matrix-product
// peak for each precision (BM_PeakMatmul*: one large product). A small step is bound by its
// operators' fixed costs (kernel launches, dispatch); a large one by the matrix products, where
// the GPU's thousands of lanes and bf16's tensor cores pay.
// GPU timings synchronize before reading the clock.
//
// Run: build/bin/bench_scaling --benchmark_out=scaling.json --benchmark_out_format=json
//      (scripts/plot-benchmarks draws samples/s against batch and TFLOP/s against width)
#include <ATen/Context.h>  // defines: at::globalContext (TF32 for cuBLAS)
#include <torch/torch.h>

#include "bench.h"
#include "autocast.h"  // defines: Autocast

namespace {

// Precision argument: 0 = fp32, 1 = TF32 (fp32 tensors, cuBLAS multiplies in TF32: CUDA only),
// 2 = bf16 autocast.
const char* kPrecisions[] = {"fp32", "tf32", "bf16"};

// The tutorial's ANN widened: fc1 784 -> W, fc2 W -> W/2, out W/2 -> 10.
struct WideAnnImpl : torch::nn::Module {
  explicit WideAnnImpl(std::int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(784, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, width / 2))),
        out(register_module("out", torch::nn::Linear(width / 2, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, out;
};
TORCH_MODULE(WideAnn);

// FLOPs of one training sample: a multiply-add per weight forward and one for the weights'
// gradients; one more for the inputs' gradients of fc2 and out (the images need none).
double train_flops_per_sample(std::int64_t width) {
  const double first = 784.0 * width, rest = width * (width / 2.0) + (width / 2.0) * 10;
  return 2 * 2 * (first + rest) + 2 * rest;
}

// TF32 for cuBLAS's fp32 products while it lives (LibTorch's default is off); put back after.
class AllowTf32 {
 public:
  explicit AllowTf32(bool on) : previous_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuBLAS(on);
  }
  ~AllowTf32() { at::globalContext().setAllowTF32CuBLAS(previous_); }

 private:
  bool previous_;
};

// ---- one training step, the width and the batch grown -------------------------------------------
void scaling_step(benchmark::State& state, const c10::Device& device) {
  const int precision = static_cast<int>(state.range(0));
  const std::int64_t width = state.range(1), batch = state.range(2);
  if (precision == 1 && !device.is_cuda()) {
    state.SkipWithError("TF32 is a CUDA precision (tensor cores); the CPU has none");
    return;
  }
  state.SetLabel(kPrecisions[precision]);
  torch::manual_seed(1);
  WideAnn model(width);
  model->to(device);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor images = torch::rand({batch, 784}, on);
  const torch::Tensor labels = torch::randint(10, {batch}, on.dtype(torch::kLong));
  AllowTf32 tf32(precision == 1);
  bench::run_timed(state, device, [&] {
    adam.zero_grad();
    torch::Tensor loss;
    {  // with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16): forward and loss
      lesson08::Autocast autocast(device.type(), torch::kBFloat16, /*enabled=*/precision == 2);
      loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    }
    loss.backward();
    adam.step();
  });
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["FLOP/s"] = benchmark::Counter(train_flops_per_sample(width) * batch,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ScalingStepCpu(benchmark::State& state) { scaling_step(state, torch::kCPU); }
void BM_ScalingStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) scaling_step(state, device);
}

// ---- the device's matrix-product peak, per precision -------------------------------------------
// One n x n product, its inputs already in the precision (bf16 as bf16 tensors: no casts timed).
void peak_matmul(benchmark::State& state, const c10::Device& device) {
  const int precision = static_cast<int>(state.range(0));
  const std::int64_t n = state.range(1);
  if (precision == 1 && !device.is_cuda()) {
    state.SkipWithError("TF32 is a CUDA precision (tensor cores); the CPU has none");
    return;
  }
  state.SetLabel(kPrecisions[precision]);
  const auto on = torch::TensorOptions().device(device).dtype(precision == 2 ? torch::kBFloat16
                                                                             : torch::kFloat);
  const torch::Tensor a = torch::randn({n, n}, on), b = torch::randn({n, n}, on);
  torch::Tensor c = torch::empty({n, n}, on);
  AllowTf32 tf32(precision == 1);
  bench::run_timed(state, device, [&] { torch::mm_out(c, a, b); });
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PeakMatmulCpu(benchmark::State& state) { peak_matmul(state, torch::kCPU); }
void BM_PeakMatmulCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) peak_matmul(state, device);
}

}  // namespace

// The CPU runs the GPU's cases but TF32 (its largest, a 4096-wide step of batch 4096, is about
// 0.3 TFLOP: a second or more on a few cores), so that each GPU figure has the same machine's CPU
// beside it.
BENCHMARK(BM_ScalingStepCpu)
    ->ArgNames({"precision", "width", "batch"})
    ->ArgsProduct({{0, 2}, {128, 512, 1024, 4096}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScalingStepCuda)
    ->ArgNames({"precision", "width", "batch"})
    ->ArgsProduct({{0, 1, 2}, {128, 512, 1024, 4096}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PeakMatmulCpu)
    ->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 2}, {2048}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PeakMatmulCuda)
    ->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1, 2}, {8192}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
