// Lesson 19 (going further) — CUDA graphs: lesson 05's training step captured once and replayed
// for every batch, measured against the same step run eagerly.
//
// A step of the tutorial's small model is two to four hundred ATen operators (forward, backward,
// Adam over six parameter tensors; the lesson counts them), most of them one small kernel on a GPU.
// There the CPU launches them one by one, and the GPU finishes each sooner than the CPU launches
// the next: the GPU waits. A CUDA graph records the whole step once
// and replays it with one launch.
//
// You will learn:
//   - why LibTorch's Adam cannot be captured: it counts its steps on the host, and a graph replays
//     every host number as it was at capture, so the first bias corrections would come back at
//     every step, silently. DeviceAdam keeps the count on the device; it is checked against
//     torch::optim::Adam on any device;
//   - PyTorch's capture recipe in C++: warm-up steps on a side stream, capture_begin(),
//     capture_end(), replay(), and the static tensors each batch is copied into;
//   - the graphed step checked against the eager step on the same batches, and both timed.
//
// Run:    build/bin/lesson19_cuda_graphs [--device auto|cpu|cuda|cuda:N] [--steps N] [--quick]
//           [--data-dir DIR]
// Checks: DeviceAdam trains as torch::optim::Adam (losses within kAdamTolerance, relative); on
//         CUDA, the graphed step's losses equal the eager step's within kGraphTolerance over
//         every step (on the CPU the graph prints "(skipped: needs CUDA)"). Exit 0 PASS, 1 FAIL,
//         2 bad flag or missing data.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::pow_out

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <vector>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <ATen/cuda/CUDAEvent.h>     // defines: at::cuda::CUDAEvent (orders two streams)
#include <ATen/cuda/CUDAGraph.h>     // defines: at::cuda::CUDAGraph (capture, replay)
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_synchronize
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getStreamFromPool
#endif

#include "common/ann.h"      // defines: ANN (the tutorial's model, lesson 05's)
#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/compare.h"  // defines: tolerance_for
#include "common/data.h"     // defines: ImageSet, find_fashion_mnist, load_fashion_mnist
#include "common/device.h"   // defines: why_no_cuda
#include "common/report.h"   // defines: TimedRun, print_timed_runs, format
#include "common/timing.h"   // defines: time_median, per_piece, count_operators
#include "common/verdict.h"  // defines: Verdict, report_error

namespace lesson19 {

// ---- knobs -----------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 5;       // lesson 05's: the first weights and the batches' order
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;  // torch::optim::Adam's defaults
constexpr int kSteps = 300, kQuickSteps = 40;          // --steps: batches each check trains on
[[maybe_unused]] constexpr int kGraphWarmupSteps = 3;  // eager steps before the capture
constexpr int kTimedSteps = 50;  // steps per timed run; the median of kTimedRuns runs
constexpr int kTimedRuns = 5;
// DeviceAdam folds lr / (1 - beta1^t) into its divisor, so a step may round a last bit otherwise
// than LibTorch's Adam, and training carries such bits on: ten times fp32's (common/compare.h).
constexpr double kAdamTolerance = 10 * course::tolerance_for(torch::kFloat);
// Graphed and eager run the same kernels, unless cuBLAS picks another on the capture stream: fp32
// rounding, grown over the steps; a frozen step count is off by far more within a few steps.
constexpr double kGraphTolerance = 10 * course::tolerance_for(torch::kFloat);
//! [knobs]

using course::ANN;  // the tutorial's ANN (fc1, fc2, out), lesson 05's weights from one seed

// The batches the checks and the timings train on: the training images on the device, in one
// shuffled order from the seed; batch i is a slice of them.
struct Batches {
  torch::Tensor images, labels;  // [N, 784] float32 and [N] int64, on the device
  std::int64_t count() const { return images.size(0) / kBatchSize; }
  torch::Tensor images_of(std::int64_t i) const {
    return images.narrow(0, i * kBatchSize, kBatchSize);
  }
  torch::Tensor labels_of(std::int64_t i) const {
    return labels.narrow(0, i * kBatchSize, kBatchSize);
  }
};

Batches device_batches(const course::ImageSet& train, const torch::Device& device,
                       std::uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor order = torch::randperm(train.labels.size(0));
  return {train.images.reshape({-1, 28 * 28}).index_select(0, order).to(device),
          train.labels.index_select(0, order).to(device)};
}

// model = ANN().to(device), from lesson 05's first weights: each form below trains its own copy.
ANN seeded_model(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);
  ANN model;
  model->to(device);
  return model;
}

// ---- the eager step: lesson 05's ------------------------------------------------------------
//! [tutorial-step]
// Lesson 05's step, on a batch already on the device. Adam's step count lives on the host.
torch::Tensor tutorial_step(ANN& model, torch::optim::Adam& optimizer, const torch::Tensor& images,
                            const torch::Tensor& labels) {
  optimizer.zero_grad();  // optimizer.zero_grad()
  const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
  loss.backward();       // loss.backward()
  optimizer.step();      // optimizer.step()
  return loss.detach();  // on the device: no .item(), no wait
}
//! [tutorial-step]

// ---- 1. Adam that a graph can capture -------------------------------------------------------
//! [device-adam]
// torch::optim::Adam's arithmetic, with its step count and bias corrections in tensors on the
// device: every replay of a graph adds one to the count there. Its zero_grad() zeroes each
// gradient where it lies (LibTorch 2.x's sets it to none, and backward would make a new one at
// another address, which a graph would never read).
class DeviceAdam {
 public:
  DeviceAdam(std::vector<torch::Tensor> parameters, double lr)
      : parameters_(std::move(parameters)), lr_(lr) {
    for (const auto& p : parameters_) {
      exp_avg_.push_back(torch::zeros_like(p));
      exp_avg_sq_.push_back(torch::zeros_like(p));
      denom_.push_back(torch::empty_like(p));
    }
    steps_ = torch::zeros({}, parameters_.front().options().dtype(torch::kDouble));  // 0-dim
    bias1_ = torch::empty_like(steps_);
    bias2_ = torch::empty_like(steps_);
  }
  void zero_grad() {
    for (auto& p : parameters_)
      if (p.grad().defined()) p.mutable_grad().zero_();
  }
  void step() {  // kernels only: no host sync, no host number that changes from step to step
    torch::NoGradGuard no_grad;
    steps_.add_(1);
    torch::pow_out(bias1_, kBeta1, steps_).neg_().add_(1);          // 1 - beta1^t, on the device
    torch::pow_out(bias2_, kBeta2, steps_).neg_().add_(1).sqrt_();  // sqrt(1 - beta2^t)
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const torch::Tensor& grad = parameters_[i].grad();
      exp_avg_[i].mul_(kBeta1).add_(grad, 1 - kBeta1);
      exp_avg_sq_[i].mul_(kBeta2).addcmul_(grad, grad, 1 - kBeta2);
      // Adam: p -= lr / bias1 * exp_avg / (sqrt(exp_avg_sq) / sqrt(bias2) + eps). Its lr / bias1
      // is a host number; here bias1 is a tensor, so it joins the divisor.
      torch::sqrt_out(denom_[i], exp_avg_sq_[i]).div_(bias2_).add_(kEpsilon).mul_(bias1_).div_(lr_);
      parameters_[i].addcdiv_(exp_avg_[i], denom_[i], /*value=*/-1);
    }
  }
  const torch::Tensor& steps() const { return steps_; }

 private:
  std::vector<torch::Tensor> parameters_, exp_avg_, exp_avg_sq_, denom_;
  double lr_;
  torch::Tensor steps_, bias1_, bias2_;
};

// Lesson 05's step with DeviceAdam: the step a graph captures.
torch::Tensor device_adam_step(ANN& model, DeviceAdam& adam, const torch::Tensor& images,
                               const torch::Tensor& labels) {
  adam.zero_grad();
  const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
  loss.backward();
  adam.step();
  return loss.detach();
}
//! [device-adam]

// DeviceAdam against torch::optim::Adam: two models from one seed, the same `steps` batches; the
// largest relative difference of their losses (read once, at the end).
double device_adam_vs_libtorch(const Batches& batches, int steps, const torch::Device& device,
                               std::uint64_t seed) {
  ANN theirs = seeded_model(device, seed), mine = seeded_model(device, seed);
  torch::optim::Adam adam(theirs->parameters(), torch::optim::AdamOptions(kLearningRate));
  DeviceAdam device_adam(mine->parameters(), kLearningRate);
  torch::Tensor worst = torch::zeros({}, torch::TensorOptions().device(device));
  for (int i = 0; i < steps; ++i) {
    const auto k = i % batches.count();
    const torch::Tensor expected =
        tutorial_step(theirs, adam, batches.images_of(k), batches.labels_of(k));
    const torch::Tensor got =
        device_adam_step(mine, device_adam, batches.images_of(k), batches.labels_of(k));
    worst = torch::maximum(worst, (got - expected).abs() / expected.abs());
  }
  return worst.item<double>();
}

// ---- 2. the step in a CUDA graph ------------------------------------------------------------
//! [graphed-step]
// device_adam_step captured once and replayed: one launch replaces the step's kernel launches.
// The graph reads `images` and `labels` and writes `loss`, tensors whose addresses never change:
// copy each batch into them before step().
class GraphedStep {
 public:
  GraphedStep(ANN& model, DeviceAdam& adam, std::int64_t batch_size, const torch::Device& device)
      : model_(model), adam_(adam) {
    if (!device.is_cuda() || !torch::cuda::is_available()) {
      const std::string why = device.is_cuda() ? course::why_no_cuda() : "this is " + device.str();
      throw course::CourseError("a CUDA graph needs a CUDA device, and " + why,
                                "run with --device cuda on a machine with a GPU");
    }
    const auto on = torch::TensorOptions().device(device);  // made once, before the capture
    images = torch::zeros({batch_size, 28 * 28}, on);
    labels = torch::zeros({batch_size}, on.dtype(torch::kLong));
    loss = torch::zeros({}, on);
#ifdef GPU_LESSONS_WITH_CUDA
    stream_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()));
    graph_.emplace();
#endif
  }

  // Eager for the first kGraphWarmupSteps calls (on the capture stream), then captured and
  // replayed, then replayed.
  void step() {
#ifdef GPU_LESSONS_WITH_CUDA
    if (captured_) {
      graph_->replay();  // the whole step: one launch
      return;
    }
    // Warm-up and capture run on a side stream, after what the current stream queued (the batch).
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(stream_->device_index());
    at::cuda::CUDAEvent batch_ready, step_done;
    batch_ready.record(current);
    batch_ready.block(*stream_);
    const bool capture = calls_++ >= kGraphWarmupSteps;
    // The warm-up steps are real steps: autograd, cuBLAS and the caching allocator make what they
    // make once (gradients, handles, workspaces) before the capture, which must not. The capture
    // then starts from a GPU with nothing queued, as PyTorch's recipe has it.
    if (capture) c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard on_side_stream(*stream_);
      if (capture) graph_->capture_begin();  // from here kernels are recorded, not run
      loss.copy_(device_adam_step(model_, adam_, images, labels));
      if (capture) graph_->capture_end();
    }
    step_done.record(*stream_);
    step_done.block(current);
    if (capture) {
      captured_ = true;
      graph_->replay();  // the captured step has not run yet: run it
    }
#endif
  }
  bool captured() const { return captured_; }
  torch::Tensor images, labels;  // static input: [batch_size, 784] and [batch_size]
  torch::Tensor loss;            // the last step's loss (0-dim, on the device)

 private:
  ANN model_;
  [[maybe_unused]] DeviceAdam& adam_;  // used by the CUDA path only
  [[maybe_unused]] int calls_ = 0;
  bool captured_ = false;
#ifdef GPU_LESSONS_WITH_CUDA  // made once the device is known to be a GPU
  std::optional<c10::cuda::CUDAStream> stream_;
  std::optional<at::cuda::CUDAGraph> graph_;
#endif
};
//! [graphed-step]

//! [graphed-vs-eager]
// The graphed step against the same step run eagerly: two models from one seed, the same `steps`
// batches, each copied into the graph's own tensors. The largest relative difference of losses.
double graphed_vs_eager(const Batches& batches, int steps, const torch::Device& device,
                        std::uint64_t seed) {
  ANN eager = seeded_model(device, seed), graphed = seeded_model(device, seed);
  DeviceAdam eager_adam(eager->parameters(), kLearningRate);
  DeviceAdam graphed_adam(graphed->parameters(), kLearningRate);
  GraphedStep graph(graphed, graphed_adam, kBatchSize, device);
  torch::Tensor worst = torch::zeros({}, torch::TensorOptions().device(device));
  for (int i = 0; i < steps; ++i) {
    const auto k = i % batches.count();
    graph.images.copy_(batches.images_of(k));  // in place: the graph reads these tensors
    graph.labels.copy_(batches.labels_of(k));
    const torch::Tensor expected = device_adam_step(eager, eager_adam, graph.images, graph.labels);
    graph.step();
    worst = torch::maximum(worst, (graph.loss - expected).abs() / expected.abs());
  }
  return worst.item<double>();  // one wait for the GPU, at the end
}
//! [graphed-vs-eager]

// ---- the time per step: eager, with DeviceAdam, graphed -------------------------------------
// Each form trains its own model from the seed; a timed run is kTimedSteps steps, and the row is
// the median of kTimedRuns runs, per step.
std::vector<course::TimedRun> time_steps(const Batches& batches, const torch::Device& device,
                                         std::uint64_t seed) {
  const auto timed = [&](const std::string& name,
                         const std::function<torch::Tensor(std::int64_t)>& step) {
    std::int64_t k = 0;
    torch::Tensor loss;
    const course::Timing runs = course::time_median(
        [&] {
          for (int i = 0; i < kTimedSteps; ++i) loss = step(k++ % batches.count());
        },
        device, /*warmup=*/1, kTimedRuns);
    return course::TimedRun{name, course::per_piece(runs, kTimedSteps),
                            static_cast<double>(kBatchSize), loss.item<double>()};
  };
  std::vector<course::TimedRun> rows;
  ANN model = seeded_model(device, seed);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  rows.push_back(timed("tutorial", [&](std::int64_t k) {
    return tutorial_step(model, adam, batches.images_of(k), batches.labels_of(k));
  }));
  ANN device_model = seeded_model(device, seed);
  DeviceAdam device_adam(device_model->parameters(), kLearningRate);
  rows.push_back(timed("device", [&](std::int64_t k) {
    return device_adam_step(device_model, device_adam, batches.images_of(k), batches.labels_of(k));
  }));
  if (!device.is_cuda()) return rows;
  ANN graphed_model = seeded_model(device, seed);
  DeviceAdam graphed_adam(graphed_model->parameters(), kLearningRate);
  GraphedStep graph(graphed_model, graphed_adam, kBatchSize, device);
  rows.push_back(timed("graphed", [&](std::int64_t k) {
    graph.images.copy_(batches.images_of(k));
    graph.labels.copy_(batches.labels_of(k));
    graph.step();
    return graph.loss;
  }));
  return rows;
}

// ---- the lesson -------------------------------------------------------------------------------
void run_lesson(const course::ImageSet& train, int steps, const torch::Device& device,
                std::uint64_t seed, course::Verdict& verdict) {
  const Batches batches = device_batches(train, device, seed);
  std::cout << "\n1. DeviceAdam against torch::optim::Adam, " << steps << " steps of batch "
            << kBatchSize << "\n";
  const double adam_diff = device_adam_vs_libtorch(batches, steps, device, seed);
  verdict.check(
      adam_diff <= kAdamTolerance, "DeviceAdam trains as torch::optim::Adam",
      course::format("largest relative loss difference %.2e over %d steps (tolerance %.0e)",
                     adam_diff, steps, kAdamTolerance));
  std::cout << "\n2. the step in a CUDA graph\n";
  if (device.is_cuda()) {
    const double diff = graphed_vs_eager(batches, steps, device, seed);
    verdict.check(diff <= kGraphTolerance, "the graphed step's losses equal the eager step's",
                  course::format("largest relative difference %.2e over %d steps (tolerance %.0e)",
                                 diff, steps, kGraphTolerance));
  } else {
    std::cout << "  (skipped: needs CUDA)\n";
  }
  std::cout << "\n3. time per step, batch " << kBatchSize << "\n";
  {  // what each eager step dispatches: on a GPU, mostly one kernel launch per operator
    ANN a = seeded_model(device, seed), b = seeded_model(device, seed);
    torch::optim::Adam adam(a->parameters(), torch::optim::AdamOptions(kLearningRate));
    DeviceAdam device_adam(b->parameters(), kLearningRate);
    const auto images = batches.images_of(0), labels = batches.labels_of(0);
    tutorial_step(a, adam, images, labels);  // counted from the second step: the first also
    device_adam_step(b, device_adam, images, labels);  // makes Adam's state, once
    const long long tutorial_ops =
        course::count_operators([&] { tutorial_step(a, adam, images, labels); });
    const long long device_ops =
        course::count_operators([&] { device_adam_step(b, device_adam, images, labels); });
    std::printf("ATen operators per step: %lld with torch::optim::Adam, %lld with DeviceAdam\n",
                tutorial_ops, device_ops);
  }
  course::print_timed_runs(time_steps(batches, device, seed), "ms/step", "samples/s", "last loss",
                           device.str());
}

}  // namespace lesson19

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson19.cpp includes this file
int main(int argc, char** argv) try {
  using namespace lesson19;
  course::CommonOptions options;
  options.seed = kSeed;
  int steps = 0;  // 0: kSteps, or kQuickSteps with --quick
  course::Cli cli("lesson19_cuda_graphs", "Lesson 19: lesson 05's training step in one CUDA graph.",
                  options);
  cli.add_data_dir();
  cli.add_option("--steps", steps, "steps each check trains (0 = 300, or 40 with --quick)", 0,
                 100000);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  const auto folder = course::find_fashion_mnist(options.data_dir);
  const course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  if (steps == 0) steps = options.quick ? kQuickSteps : kSteps;
  std::cout << "Fashion-MNIST: " << train.labels.size(0)
            << " training images on the device; the tutorial's ANN, batch " << kBatchSize << "\n";
  course::Verdict verdict;
  run_lesson(train, steps, device, options.seed, verdict);
  return verdict.finish("lesson 19 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
