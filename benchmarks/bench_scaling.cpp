// bench_scaling: where the GPU wins. One training step (forward, cross-entropy, backward, Adam)
// of the tutorial's MLP shape widened, 784-W-W/2-10 (W = 128 is the tutorial's ANN), as the
// width W and the batch grow, in fp32, TF32 (CUDA) and bf16 autocast, on the CPU and the GPU of
// the same machine: samples/s and achieved FLOP/s, beside the device's measured matrix-product
// peak for each precision (BM_PeakMatmul*: one large product). A small step is bound by its
// operators' fixed costs (kernel launches, dispatch); a large one by the matrix products, where
// the GPU's thousands of lanes and bf16's tensor cores pay. On the GPU each step is timed twice:
// eager (LibTorch's dispatcher launching each kernel from the host, as Python's eager mode does)
// and graphed (BM_ScalingStepGraphedCuda: the same step captured once in a CUDA graph and
// replayed, lessons 19 and 21's recipe), so that a figure says whether it measured the GPU or the
// host's dispatch: where the two agree, the GPU's work is the step's time.
// GPU timings synchronize before reading the clock.
//
// Run: build/bin/bench_scaling --benchmark_out=scaling.json --benchmark_out_format=json
//      (scripts/plot-benchmarks draws samples/s against batch and TFLOP/s against width)
#include <ATen/Context.h>  // defines: at::globalContext (TF32 for cuBLAS)
#include <torch/torch.h>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <ATen/autocast_mode.h>      // defines: at::autocast::set_autocast_cache_enabled
#include <ATen/cuda/CUDAGraph.h>     // defines: at::cuda::CUDAGraph
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_synchronize
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getStreamFromPool
#endif

#include "autocast.h"  // defines: Autocast
#include "bench.h"
#include "common/cli.h"  // defines: CpuThreads

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
// What the eager step and the graphed one share: the model from one seed, a batch of random
// images and labels on the device, the forward pass and loss, and the counters.
WideAnn seeded_model(std::int64_t width, const c10::Device& device) {
  torch::manual_seed(1);
  WideAnn model(width);
  model->to(device);
  return model;
}

struct Batch {
  torch::Tensor images, labels;
};
Batch random_batch(std::int64_t batch, const c10::Device& device) {
  const auto on = torch::TensorOptions().device(device);
  return {torch::rand({batch, 784}, on), torch::randint(10, {batch}, on.dtype(torch::kLong))};
}

// with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16): forward and loss
torch::Tensor step_loss(WideAnn& model, const Batch& batch, int precision) {
  lesson08::Autocast autocast(batch.images.device().type(), torch::kBFloat16,
                              /*enabled=*/precision == 2);
  return torch::nn::functional::cross_entropy(model->forward(batch.images), batch.labels);
}

// Samples/s and the achieved FLOP/s of steps of `batch` samples at `width`.
void count_steps(benchmark::State& state, std::int64_t width, std::int64_t batch) {
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["FLOP/s"] = benchmark::Counter(train_flops_per_sample(width) * batch,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void scaling_step(benchmark::State& state, const c10::Device& device) {
  const int precision = static_cast<int>(state.range(0));
  const std::int64_t width = state.range(1), batch = state.range(2);
  if (precision == 1 && !device.is_cuda()) {
    state.SkipWithError("TF32 is a CUDA precision (tensor cores); the CPU has none");
    return;
  }
  state.SetLabel(kPrecisions[precision]);
  WideAnn model = seeded_model(width, device);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  const Batch data = random_batch(batch, device);
  AllowTf32 tf32(precision == 1);
  bench::run_timed(state, device, [&] {
    adam.zero_grad();
    step_loss(model, data, precision).backward();
    adam.step();
  });
  count_steps(state, width, batch);
}

// The same step in one CUDA graph, replayed: warm-up steps on a side stream (cuBLAS's handles and
// workspaces, the allocator's blocks: made before the capture, which must not make them), the
// capture there, then one replay an iteration. Adam is LibTorch's fused Adam with its step counts
// on the device (lesson 21's at::_fused_adam_), so that a replay takes the step a real one would,
// and the gradients are zeroed in place (a graph reads and writes fixed addresses). Autocast's
// cache of 16-bit weights is off for the capture, as PyTorch advises for graphs.
void scaling_step_graphed([[maybe_unused]] benchmark::State& state,
                          [[maybe_unused]] const c10::Device& device) {
#ifdef GPU_LESSONS_WITH_CUDA
  const int precision = static_cast<int>(state.range(0));
  const std::int64_t width = state.range(1), batch = state.range(2);
  state.SetLabel(std::string(kPrecisions[precision]) + " graphed");
  WideAnn model = seeded_model(width, device);
  const std::vector<torch::Tensor> params = model->parameters();
  std::vector<torch::Tensor> grads, exp_avg, exp_avg_sq, steps;
  for (const torch::Tensor& p : params) {
    grads.push_back(p.mutable_grad() = torch::zeros_like(p));
    exp_avg.push_back(torch::zeros_like(p));
    exp_avg_sq.push_back(torch::zeros_like(p));
    steps.push_back(torch::zeros({}, p.options()));
  }
  const Batch data = random_batch(batch, device);
  AllowTf32 tf32(precision == 1);
  const auto step = [&] {
    for (torch::Tensor& g : grads) g.zero_();
    step_loss(model, data, precision).backward();
    torch::NoGradGuard no_grad;  // Adam writes the parameters in place
    for (torch::Tensor& s : steps) s.add_(1);
    at::_fused_adam_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps,
                     /*lr=*/1e-3, /*beta1=*/0.9, /*beta2=*/0.999, /*weight_decay=*/0,
                     /*eps=*/1e-8, /*amsgrad=*/false, /*maximize=*/false);
  };
  at::cuda::CUDAGraph graph;
  c10::cuda::device_synchronize();
  {
    c10::cuda::CUDAStreamGuard on_side(c10::cuda::getStreamFromPool(false, device.index()));
    for (int i = 0; i < 3; ++i) step();
    c10::cuda::device_synchronize();  // the capture starts from a GPU with nothing queued
    const bool cached = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    graph.capture_begin();  // from here kernels are recorded, not run
    step();
    graph.capture_end();
    at::autocast::set_autocast_cache_enabled(cached);
  }
  c10::cuda::device_synchronize();
  bench::run_timed(state, device, [&] { graph.replay(); });
  count_steps(state, width, batch);
#endif
}

void BM_ScalingStepCpu(benchmark::State& state) { scaling_step(state, torch::kCPU); }
// The CPU's step with `threads` LibTorch threads, whatever the cores: which count is the CPU's
// fastest on this machine (a sandboxed server can wake a thread at a system call's cost, so more
// threads are not always faster), and so what the CPU's rows above ran against.
void BM_ScalingStepThreadsCpu(benchmark::State& state) {
  course::CpuThreads threads(static_cast<int>(state.range(3)));
  scaling_step(state, torch::kCPU);
}
void BM_ScalingStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) scaling_step(state, device);
}
void BM_ScalingStepGraphedCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) scaling_step_graphed(state, device);
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

// The GPU's sizes go on until its bf16 step is bound by its products, not its launches: the
// largest is long enough for a graph and the eager loop to take the same time. The CPU runs the
// GPU's cases up to 4096 but TF32 (a 4096-wide step of batch 4096 is about 0.3 TFLOP: a second
// or more on a few cores). The CPU's slowest cases come last, so that a run cut short by its time
// budget loses them rather than the GPU's rows: the largest, 8192 of 8192 (about 1.9 TFLOP), in
// fp32 and bf16, so that the GPU's largest has the same machine's CPU beside it, and the thread
// counts.
BENCHMARK(BM_ScalingStepCpu)
    ->ArgNames({"precision", "width", "batch"})
    ->ArgsProduct({{0, 2}, {128, 512, 1024, 4096}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScalingStepCuda)
    ->ArgNames({"precision", "width", "batch"})
    ->ArgsProduct({{0, 1, 2}, {128, 512, 1024, 4096, 8192}, {64, 256, 1024, 4096, 8192}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScalingStepGraphedCuda)
    ->ArgNames({"precision", "width", "batch"})
    ->ArgsProduct({{0, 1, 2}, {128, 512, 1024, 4096, 8192}, {64, 256, 1024, 4096, 8192}})
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
BENCHMARK(BM_ScalingStepCpu)
    ->ArgNames({"precision", "width", "batch"})
    ->Args({0, 8192, 8192})
    ->Args({2, 8192, 8192})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScalingStepThreadsCpu)
    ->ArgNames({"precision", "width", "batch", "threads"})
    ->ArgsProduct({{0}, {1024}, {1024}, {1, 4, 8, 16}})
    ->ArgsProduct({{0}, {4096}, {4096}, {1, 4, 8, 16}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
