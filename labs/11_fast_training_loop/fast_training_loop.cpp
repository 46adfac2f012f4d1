// Lesson 11 (going further) — a fast training loop: lesson 05's loop on Fashion-MNIST, then four
// changes that make it faster, one at a time, each measured and checked against the one before.
//
// You will learn, run by run (--run NAME), in this order:
//   - "tutorial": lesson 05's loop, unchanged (from common/ann.h: the tutorial's ANN, LibTorch's
//     DataLoader with --workers threads, loss.item() every step, torch::max for the accuracy);
//   - "pinned": each batch gathered whole into pinned memory and copied non_blocking (--workers
//     threads gather ahead), and the loss summed on the device, read once per epoch;
//   - "resident": the whole dataset copied to the device once, each batch gathered there;
//   - "flat": all parameters in one tensor: Adam in a handful of kernels, not several per tensor;
//   - "graphed" (CUDA): the whole flat step, Adam's step count on the device, in one CUDA graph.
//
// Run:    build/bin/lesson11_fast_training_loop [--device ...] [--workers N] [--epochs N] [--quick]
//           [--run all|tutorial|pinned|resident|flat|graphed] [--batch-size N] [--data-dir DIR]
// Checks: each run's test accuracy >= kAccuracyBar (kQuickAccuracyBar for shorter runs); each
//         form's losses equal the form's before it: pinned and tutorial, resident and pinned
//         (exactly, on the CPU), flat and resident (kFlatTolerance), graphed and eager
//         (kGraphTolerance). Exit 0 PASS, 1 FAIL, 2 bad flag or missing data, 77 waived (--run
//         graphed without CUDA), 130 Ctrl-C.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::index_select_out

#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <ATen/cuda/CUDAEvent.h>     // defines: at::cuda::CUDAEvent (orders two streams)
#include <ATen/cuda/CUDAGraph.h>     // defines: at::cuda::CUDAGraph (capture, replay)
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_synchronize
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getStreamFromPool
#endif

#include "common/ann.h"  // defines: ANN, make_train_loader, train_epoch, test_accuracy (lesson 05's)
#include "common/cli.h"        // defines: Cli, start_lesson
#include "common/compare.h"    // defines: tolerance_for
#include "common/data.h"       // defines: ImageSet, find_fashion_mnist, load_fashion_mnist, take
#include "common/device.h"     // defines: why_no_cuda
#include "common/interrupt.h"  // defines: stop_requested (Ctrl-C)
#include "common/prefetch.h"   // defines: Prefetcher (threads making items ahead, taken in order)
#include "common/report.h"     // defines: EpochStats, run_epochs, ProgressLine, print_timed_runs
#include "common/timing.h"     // defines: Stopwatch, count_operators
#include "common/verdict.h"    // defines: Verdict, report_error

namespace lesson11 {

// ---- knobs -----------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 5;       // lesson 05's: the first weights and the batches' order
constexpr int kEpochs = 5;               // the tutorial's: for epoch in range(5)
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr int kWorkers = 2, kMaxWorkers = 16;  // --workers: lesson 05's num_workers=2; <= 16
constexpr double kAccuracyBar = 0.85;          // test accuracy after kEpochs on all 60,000 images
// --quick: one epoch on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
constexpr std::int64_t kPixels = 28 * 28;
// The flat step does Adam's arithmetic on each element, but a kernel that vectorizes may round a
// last bit otherwise, and training carries such bits on: ten times fp32's (common/compare.h).
constexpr double kFlatTolerance = 10 * course::tolerance_for(torch::kFloat);
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;  // torch::optim::Adam's defaults
constexpr int kGraphWarmupSteps = 3;   // eager steps on the capture stream before the capture
constexpr int kGraphCheckSteps = 200;  // graphed against eager: losses compared over this many
// Graphed and eager run the same kernels, unless cuBLAS picks another on the capture stream: fp32
// rounding, grown over the steps, hence ten times fp32's; a frozen host number is off by far more.
constexpr double kGraphTolerance = 10 * course::tolerance_for(torch::kFloat);
//! [knobs]

// ---- the tutorial's loop: lesson 05's, from common/ann.h --------------------------------------
using course::ANN;         // the tutorial's ANN (fc1, fc2, out): one seed, lesson 05's weights
using course::EpochStats;  // an epoch's mean loss, seconds, samples, and whether Ctrl-C stopped it

//! [tutorial]
struct Trainer {  // model = ANN().to(device); optimizer = optim.Adam(model.parameters(), lr=1e-3)
  ANN model;
  std::unique_ptr<torch::optim::Adam> optimizer;
};

Trainer make_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // every run starts from the same weights
  Trainer trainer;
  // TODO(lab 11.1): move the model to `device`, then build Adam (kLearningRate) over its parameters
  throw std::logic_error("lab 11.1 is not done: move the model to `device`, then build Adam (kLearningRate) over its parameters");
  return trainer;
}

// One epoch of lesson 05's loop over LibTorch's DataLoader (course::make_train_loader), timed.
EpochStats train_epoch_tutorial(Trainer& trainer, course::TrainLoader& train_loader,
                                std::int64_t samples, const torch::Device& device) {
  course::Stopwatch watch(device);  // waits for the GPU before it reads the clock
  const auto [steps, loss] =
      course::train_epoch(trainer.model, *trainer.optimizer, train_loader, device);
  return {loss, watch.seconds(), samples, /*interrupted=*/false};
}
//! [tutorial]

// ---- 1. "pinned" and 2. "resident": where the batches come from; the loss read once per epoch --
struct Batch {  // float32 images [B, 784] and int64 labels [B], on the training device
  torch::Tensor images, labels;
};

//! [loader]
// "pinned": each batch gathered on the host in one index_select (not 64 images stacked one by
// one), into pinned memory on CUDA, and copied non_blocking. "resident": the whole dataset is
// copied to the device once, and each batch is gathered there.
class Loader {
 public:
  Loader(const std::string& name, const course::ImageSet& data, std::int64_t batch_size,
         const torch::Device& device, int workers = 0)
      : resident_(name == "resident"), batch_size_(batch_size), device_(device), workers_(workers) {
    if (name != "pinned" && !resident_)
      throw course::UsageError("unknown loader '" + name + "'", "use pinned or resident");
    // resident: one copy of the whole dataset to the device, up front
    images_ = data.images.reshape({-1, kPixels}).to(resident_ ? device : torch::kCPU).contiguous();
    labels_ = data.labels.to(resident_ ? device : torch::kCPU);
    new_order();  // as LibTorch's RandomSampler: an order drawn as the loader is made, and
  }               // another as each epoch starts; so one seed gives the DataLoader's batches
  void start_epoch() {
    ahead_.stop();  // the workers of an epoch left half-way read the old order: stop them first
    new_order();
    // DataLoader(num_workers=N, pin_memory=True) as threads (C++ has no interpreter lock): they
    // gather the next batches while this one trains; taken in order, the same batches as without.
    if (workers_ == 0 || resident_) return;
    const std::int64_t batches = (size() + batch_size_ - 1) / batch_size_;
    ahead_.start(batches, workers_, [this](std::int64_t k) { return gather(k); });
  }
  // The next batch (false at the end of the epoch). Resident, it is written into `batch`'s own
  // tensors when they have its size: their addresses stay those a CUDA graph reads.
  bool next(Batch& batch) {
    if (cursor_ >= size()) return false;
    const std::int64_t k = cursor_ / batch_size_;
    cursor_ += batch_size_;
    if (resident_) {
      batch = gather(k, batch);  // a gather kernel on the device: no copy, no host work
      return true;
    }
    const Batch host = workers_ == 0 ? gather(k) : ahead_.take(k);  // pinned on CUDA
    // TODO(lab 11.2): copy host's images and labels into `batch` on device_ (non_blocking if pinned_)
    throw std::logic_error("lab 11.2 is not done: copy host's images and labels into `batch` on device_ (non_blocking if pinned_)");
    return true;
  }
  std::int64_t size() const { return images_.size(0); }
  std::string name() const { return resident_ ? "resident" : "pinned"; }

 private:
  // A new order, made where the data lives: resident, nothing crosses the host-device link.
  void new_order() {
    order_ = torch::randperm(size(), torch::dtype(torch::kLong).device(images_.device()));
    cursor_ = 0;
  }
  // Batch k of the epoch's order, gathered where the data lives (into `out` if it has the size).
  // On the host under CUDA, into pinned memory the copy engine reads directly: the copy overlaps
  // the CPU's next batch; LibTorch's pinned allocator reuses a block once its copy is done.
  Batch gather(std::int64_t k, Batch out = {}) const {
    const torch::Tensor idx = order_.slice(0, k * batch_size_, (k + 1) * batch_size_);
    if (!out.labels.defined() || out.labels.size(0) != idx.size(0)) {
      out = Batch{torch::empty({idx.size(0), kPixels}, images_.options().pinned_memory(pinned_)),
                  torch::empty({idx.size(0)}, labels_.options().pinned_memory(pinned_))};
    }
    torch::index_select_out(out.images, images_, 0, idx);
    torch::index_select_out(out.labels, labels_, 0, idx);
    return out;
  }

  bool resident_;
  std::int64_t batch_size_, cursor_ = 0;
  torch::Device device_;
  int workers_;
  bool pinned_ = device_.is_cuda() && !resident_;  // the pinned path on CUDA
  torch::Tensor images_, labels_, order_;
  course::Prefetcher<Batch> ahead_;  // last: its threads stop before what they read is gone
};
//! [loader]

//! [epoch]
// The tutorial's step, unchanged, on a batch the loader put on the device; its loss stays there.
torch::Tensor tutorial_step(Trainer& trainer, const Batch& batch) {
  torch::optim::Adam& optimizer = *trainer.optimizer;
  // TODO(lab 11.3): zero the gradients the last step left
  throw std::logic_error("lab 11.3 is not done: zero the gradients the last step left");
  const torch::Tensor loss =  // loss = criterion(model(features), labels)
      torch::nn::functional::cross_entropy(trainer.model->forward(batch.images), batch.labels);
  // TODO(lab 11.4): backpropagate the loss, then let the optimizer take its step
  throw std::logic_error("lab 11.4 is not done: backpropagate the loss, then let the optimizer take its step");
  return loss.detach();
}

// One epoch: `step` trains on each batch and returns its loss. The tutorial's total_loss +=
// loss.item() waits for the GPU at every step: the sum stays on the device instead (in double,
// as Python's float), read once at the end. The loader writes each batch into `batch` if it can.
template <typename Step>
EpochStats run_epoch(Loader& loader, const torch::Device& device, Step&& step, Batch batch = {}) {
  course::Stopwatch watch(device);
  course::ProgressLine line(loader.size());  // every 100 steps, on a terminal
  torch::Tensor loss_sum = torch::zeros({}, torch::dtype(torch::kDouble).device(device));
  std::int64_t steps = 0, seen = 0;
  loader.start_epoch();
  while (loader.next(batch)) {  // each batch on the device
    // TODO(lab 11.5): add the step's loss to loss_sum, on the device: no .item() in the loop
    throw std::logic_error("lab 11.5 is not done: add the step's loss to loss_sum, on the device: no .item() in the loop");
    ++steps;
    seen += batch.labels.size(0);
    if (course::stop_requested()) break;  // Ctrl-C: the step is whole; stop here (lesson 10)
    line.update(seen);
  }
  const double total_loss = loss_sum.item<double>();  // the one wait for the GPU, per epoch
  return {total_loss / static_cast<double>(steps), watch.seconds(), seen, seen < loader.size()};
}

// The tutorial's step, fed by this lesson's loader: the "pinned" and "resident" runs.
EpochStats train_epoch_loaded(Trainer& trainer, Loader& loader, const torch::Device& device) {
  trainer.model->train();  // model.train()
  return run_epoch(loader, device, [&](const Batch& b) { return tutorial_step(trainer, b); });
}
//! [epoch]

// ---- 3. "flat": all parameters in one tensor ----------------------------------------------------
struct FlatParameters {  // values: the optimizer's only parameter; gradients: values.grad(),
  torch::Tensor values, gradients;  // into which backward accumulates in place
};

//! [flatten]
FlatParameters flatten_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> params = model.parameters();
  std::int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  FlatParameters flat;
  flat.values = torch::empty({total}, params.front().options().requires_grad(false));
  flat.gradients = torch::zeros({total}, flat.values.options());
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& p : params) {
    const std::int64_t n = p.numel();
    torch::Tensor values = flat.values.slice(0, offset, offset + n).view(p.sizes());
    values.copy_(p);
    p.set_data(values);  // the parameter now lives inside flat.values
    // Backward adds into an existing .grad() in place: each gradient lands in flat.gradients.
    p.mutable_grad() = flat.gradients.slice(0, offset, offset + n).view(p.sizes());
    offset += n;
  }
  flat.values.mutable_grad() = flat.gradients;
  return flat;
}

struct FlatTrainer : Trainer {  // the model's parameters in `flat`; Adam over flat.values only
  FlatParameters flat;
};

FlatTrainer make_flat_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the tutorial's first weights
  FlatTrainer trainer;
  trainer.model->to(device);                                 // 1. the model moves once,
  trainer.flat = flatten_parameters(*trainer.model);         // 2. its parameters become one tensor,
  trainer.optimizer = std::make_unique<torch::optim::Adam>(  // 3. and the optimizer comes last
      std::vector<torch::Tensor>{trainer.flat.values}, torch::optim::AdamOptions(kLearningRate));
  return trainer;
}
//! [flatten]

//! [flat-step]
torch::Tensor flat_step(FlatTrainer& trainer, const Batch& batch) {
  // TODO(lab 11.6): zero every parameter's gradient at once: they all live in trainer.flat.gradients
  throw std::logic_error("lab 11.6 is not done: zero every parameter's gradient at once: they all live in trainer.flat.gradients");
  const torch::Tensor loss =
      torch::nn::functional::cross_entropy(trainer.model->forward(batch.images), batch.labels);
  loss.backward();            // each gradient lands in trainer.flat.gradients
  trainer.optimizer->step();  // Adam over one tensor: a handful of kernels in all
  return loss.detach();
}

// The flat epoch checks first that every gradient is still a view into the flat gradient tensor,
// where Adam reads it. A zero_grad() on the parameters breaks that: LibTorch 2.x sets each
// gradient to none and backward makes new ones that Adam never sees (1.13 refuses it).
EpochStats train_epoch_flat(FlatTrainer& trainer, Loader& loader, const torch::Device& device) {
  const auto* begin = static_cast<const char*>(trainer.flat.gradients.data_ptr());
  for (const auto& p : trainer.model->parameters()) {
    const auto* grad = p.grad().defined() ? static_cast<const char*>(p.grad().data_ptr()) : nullptr;
    if (grad == nullptr || grad < begin || grad >= begin + trainer.flat.gradients.nbytes()) {
      throw course::CourseError(
          "a gradient is outside the flat gradient tensor, where Adam reads: zero_grad() was "
          "called on the parameters of a flattened model",
          "zero the flat gradients instead (trainer.flat.gradients.zero_()), or do not flatten");
    }
  }
  trainer.model->train();
  return run_epoch(loader, device, [&](const Batch& batch) { return flat_step(trainer, batch); });
}
//! [flat-step]

// ---- 4. "graphed": the whole step in a CUDA graph (CUDA only) -----------------------------------
//! [device-adam]
// Adam with its step count and bias corrections in tensors on the device, so that a CUDA graph
// can capture its step: torch::optim::Adam counts on the host, and a graph of it would replay the
// first step's bias corrections forever, without an error. Same arithmetic and defaults.
class DeviceAdam {
 public:
  DeviceAdam(const FlatParameters& flat, double lr)
      : values_(flat.values), gradients_(flat.gradients), lr_(lr) {}
  void step() {  // kernels only: no host sync, no host number that changes from step to step
    torch::NoGradGuard no_grad;
    steps_.add_(1);  // the step count is a tensor: each replay of a graph adds one on the device
    torch::pow_out(bias1_, kBeta1, steps_).neg_().add_(1);  // 1 - beta1^t, on the device too
    torch::pow_out(bias2_, kBeta2, steps_).neg_().add_(1);  // 1 - beta2^t
    exp_avg_.mul_(kBeta1).add_(gradients_, 1 - kBeta1);
    exp_avg_sq_.mul_(kBeta2).addcmul_(gradients_, gradients_, 1 - kBeta2);
    // torch::optim::Adam: values -= lr / bias1 * exp_avg / (sqrt(exp_avg_sq) / sqrt(bias2) + eps).
    // Its lr / bias1 is a host number; here bias1 is a tensor, so it joins the denominator.
    torch::sqrt_out(denom_, exp_avg_sq_).div_(bias2_.sqrt_()).add_(kEpsilon).mul_(bias1_).div_(lr_);
    values_.addcdiv_(exp_avg_, denom_, /*value=*/-1);
  }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const torch::Tensor& steps() const { return steps_; }

 private:
  torch::Tensor values_, gradients_;
  double lr_;
  torch::Tensor exp_avg_ = torch::zeros_like(values_), exp_avg_sq_ = torch::zeros_like(values_);
  torch::Tensor denom_ = torch::empty_like(values_);  // scratch for the update
  torch::Tensor steps_ = torch::zeros({}, values_.options().dtype(torch::kDouble));  // 0-dim
  torch::Tensor bias1_ = torch::empty_like(steps_), bias2_ = torch::empty_like(steps_);
};
//! [device-adam]

// One training step of the flat model with DeviceAdam; its loss, on the device.
torch::Tensor device_adam_step(ANN& model, const FlatParameters& flat, DeviceAdam& adam,
                               const torch::Tensor& images, const torch::Tensor& labels) {
  flat.gradients.zero_();
  const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
  loss.backward();
  adam.step();
  return loss.detach();
}

//! [graphed-step]
// device_adam_step captured once in a CUDA graph and replayed for every batch of `batch_size`:
// one launch replaces the step's kernel launches, one per operator. The graph reads `batch` and
// writes `loss`, tensors whose addresses never change: fill `batch` in place before each step().
class GraphedStep {
 public:
  GraphedStep(ANN& model, const FlatParameters& flat, DeviceAdam& adam, std::int64_t batch_size,
              const torch::Device& device)
      : model_(model), flat_(flat), adam_(adam) {
    if (!device.is_cuda() || !torch::cuda::is_available()) {
      const std::string why = device.is_cuda() ? course::why_no_cuda() : "this is " + device.str();
      throw course::CourseError("a CUDA graph needs a CUDA device, and " + why,
                                "run with --device cuda on a machine with a GPU");
    }
    // The graph reads and writes these very tensors at every replay: made once, before capture.
    const auto on = torch::TensorOptions().device(device);
    batch = Batch{torch::zeros({batch_size, kPixels}, on),
                  torch::zeros({batch_size}, on.dtype(torch::kLong))};
    loss = torch::zeros({}, on);
#ifdef GPU_LESSONS_WITH_CUDA
    stream_.emplace(c10::cuda::getStreamFromPool(false, device.index()));  // never the default
    graph_.emplace();
#endif
  }

  // One step on `batch`: eager for the first kGraphWarmupSteps calls (on the capture stream),
  // then captured and replayed, then replayed.
  void step() {
#ifdef GPU_LESSONS_WITH_CUDA
    if (captured_) return graph_->replay();  // the whole step: one launch, on the current stream
    // Warm-up and capture run on a side stream, after what the current stream queued (the batch).
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(stream_->device_index());
    at::cuda::CUDAEvent batch_ready, step_done;
    batch_ready.record(current);
    batch_ready.block(*stream_);
    const bool capture = calls_++ >= kGraphWarmupSteps;
    // The warm-up steps are real steps: they let autograd, cuBLAS and the caching allocator make
    // everything they make once (workspaces, handles) before the capture, which must not.
    if (capture) c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard on_side_stream(*stream_);
      if (capture) graph_->capture_begin();  // from here kernels are recorded, not run
      loss.copy_(device_adam_step(model_, flat_, adam_, batch.images, batch.labels));
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
  Batch batch;         // static input: [batch_size, 784] images, [batch_size] labels
  torch::Tensor loss;  // the last step's loss, written by the step (0-dim, on the device)

 private:
  ANN model_;
  FlatParameters flat_;
  DeviceAdam& adam_;
  int calls_ = 0;
  bool captured_ = false;
#ifdef GPU_LESSONS_WITH_CUDA  // made once the device is known to be a GPU
  std::optional<c10::cuda::CUDAStream> stream_;
  std::optional<at::cuda::CUDAGraph> graph_;
#endif
};
// The resident loader gathers each batch into the graph's own tensors (`batch`): a full batch
// replays the graph; the shorter last one takes the same step eagerly (a graph has fixed shapes).
EpochStats train_epoch_graphed(ANN& model, const FlatParameters& flat, DeviceAdam& adam,
                               GraphedStep& graph, Loader& loader, const torch::Device& device) {
  model->train();
  const auto step = [&](const Batch& batch) {
    if (!batch.images.is_same(graph.batch.images)) {  // the short last batch
      return device_adam_step(model, flat, adam, batch.images, batch.labels);
    }
    graph.step();
    return graph.loss;
  };
  return run_epoch(loader, device, step, graph.batch);
}
//! [graphed-step]

// The graphed step against the same step run eagerly, from the same seed on the same batches (the
// first `steps` full batches of `data`, in order): the largest relative difference of the losses.
double graphed_vs_eager(const course::ImageSet& data, std::int64_t batch_size,
                        const torch::Device& device, std::uint64_t seed, int steps) {
  FlatTrainer eager = make_flat_trainer(device, seed), graphed = make_flat_trainer(device, seed);
  DeviceAdam eager_adam(eager.flat, kLearningRate), graphed_adam(graphed.flat, kLearningRate);
  GraphedStep graph(graphed.model, graphed.flat, graphed_adam, batch_size, device);
  const torch::Tensor images = data.images.reshape({-1, kPixels}).to(device);
  const torch::Tensor labels = data.labels.to(device);
  torch::Tensor worst = torch::zeros({}, torch::TensorOptions().device(device));
  for (int i = 0; i < steps; ++i) {
    const std::int64_t start = (i % (images.size(0) / batch_size)) * batch_size;
    graph.batch.images.copy_(images.slice(0, start, start + batch_size));  // in place: the graph
    graph.batch.labels.copy_(labels.slice(0, start, start + batch_size));  // reads these tensors
    const torch::Tensor expected = device_adam_step(eager.model, eager.flat, eager_adam,
                                                    graph.batch.images, graph.batch.labels);
    graph.step();
    worst = torch::maximum(worst, ((graph.loss - expected).abs() / expected.abs()));
  }
  return worst.item<double>();  // one sync, at the end
}

// ---- a whole run --------------------------------------------------------------------------------
struct RunResult {
  std::vector<EpochStats> epochs;
  double accuracy = 0;  // on the test set, by course::test_accuracy (lesson 05's torch::max)
};

// A whole run from a seeded model, then its test accuracy. Each run makes its trainer, then its
// loader, which draws its first order: from one seed, on the CPU, every run sees the same batches.
RunResult train_and_evaluate(const course::ImageSet& train, const course::ImageSet& test,
                             const std::string& run, int epochs, std::int64_t batch_size,
                             const torch::Device& device, std::uint64_t seed, int workers = 0) {
  const std::int64_t samples = train.labels.size(0);
  const auto train_epochs = [&](const std::function<EpochStats()>& epoch) {  // Ctrl-C ends the
    return course::run_epochs(run, epochs, samples, epoch,  // step under way, then the run
                              "nothing is saved (lesson 10 saves and resumes runs)");
  };
  RunResult result;
  if (run == "tutorial") {  // lesson 05's program: the model, Adam, then LibTorch's DataLoader
    Trainer trainer = make_trainer(device, seed);
    auto train_loader = course::make_train_loader(course::FashionMNIST(train), batch_size, workers);
    result.epochs =
        train_epochs([&] { return train_epoch_tutorial(trainer, *train_loader, samples, device); });
    result.accuracy = course::test_accuracy(trainer.model, test, device);
  } else if (run == "pinned" || run == "resident") {  // the same, with this lesson's loader
    Trainer trainer = make_trainer(device, seed);
    Loader loader(run, train, batch_size, device, workers);
    result.epochs = train_epochs([&] { return train_epoch_loaded(trainer, loader, device); });
    result.accuracy = course::test_accuracy(trainer.model, test, device);
  } else if (run == "flat" || run == "graphed") {  // the resident loader, flat parameters
    FlatTrainer trainer = make_flat_trainer(device, seed);
    Loader loader("resident", train, batch_size, device);
    std::optional<DeviceAdam> adam;  // graphed: Adam's step count on the device, and one graph
    std::optional<GraphedStep> graph;
    if (run == "graphed") {
      adam.emplace(trainer.flat, kLearningRate);
      graph.emplace(trainer.model, trainer.flat, *adam, batch_size, device);
    }
    result.epochs = train_epochs([&] {
      return graph ? train_epoch_graphed(trainer.model, trainer.flat, *adam, *graph, loader, device)
                   : train_epoch_flat(trainer, loader, device);
    });
    result.accuracy = course::test_accuracy(trainer.model, test, device);
  } else {
    throw course::UsageError("no run '" + run + "'",
                             "use tutorial, pinned, resident, flat or graphed");
  }
  return result;
}

// ---- the comparison: each faster form timed and checked against the form before it -------------
void compare_runs(const std::vector<std::string>& runs, const course::ImageSet& train,
                  const course::ImageSet& test, int epochs, std::int64_t batch_size, int workers,
                  double bar, const torch::Device& device, std::uint64_t seed,
                  course::Verdict& verdict) {
  std::map<std::string, RunResult> results;
  std::vector<course::TimedRun> rows;
  for (const auto& run : runs) {
    results[run] = train_and_evaluate(train, test, run, epochs, batch_size, device, seed, workers);
    rows.push_back({run, course::epoch_timing(results[run].epochs),  // after the first epoch
                    static_cast<double>(train.labels.size(0)), results[run].accuracy});
  }
  course::print_timed_runs(rows, "s/epoch", "samples/s", "test accuracy", device.str());
  const auto ran = [&](const std::string& run) { return results.count(run) != 0; };
  if (ran("flat")) {  // what the flat step saves: ATen operators, one step each
    const Batch batch{train.images.slice(0, 0, batch_size).reshape({-1, kPixels}).to(device),
                      train.labels.slice(0, 0, batch_size).to(device)};
    Trainer tutorial = make_trainer(device, kSeed);
    FlatTrainer flat = make_flat_trainer(device, kSeed);
    const long long tutorial_ops = course::count_operators([&] { tutorial_step(tutorial, batch); });
    const long long flat_ops = course::count_operators([&] { flat_step(flat, batch); });
    std::printf("ATen operators per step: %lld with Adam over %zu parameter tensors, %lld flat\n",
                tutorial_ops, tutorial.model->parameters().size(), flat_ops);
  }
  // Each form against the form before it, from the same seed: their epoch losses.
  const auto same_losses = [&](const std::string& a, const std::string& b, double tolerance,
                               const std::string& why) {
    const double diff = course::max_loss_difference(results[a].epochs, results[b].epochs);
    verdict.check(diff <= tolerance, a + " trains as " + b + ": " + why,
                  course::format("epoch losses within %.2e (tolerance %.0e)", diff, tolerance));
  };
  if (ran("pinned") && ran("tutorial"))  // same batches, same steps (a GPU may round otherwise)
    same_losses("pinned", "tutorial", device.is_cpu() ? 0.0 : kFlatTolerance, "same batches");
  if (ran("resident") && ran("pinned") && device.is_cpu())  // a GPU draws another order
    same_losses("resident", "pinned", 0.0, "on the CPU both loaders give the same batches");
  if (ran("flat") && ran("resident"))  // the same model, data and batches; Adam's bookkeeping
    same_losses("flat", "resident", kFlatTolerance, "one tensor, the same arithmetic");
  if (ran("graphed")) {
    // A graph replays every host number as it was at capture: a step count kept on the host
    // would replay step 4's bias corrections at every step. Same batches, eager and graphed:
    const double diff = graphed_vs_eager(train, batch_size, device, seed, kGraphCheckSteps);
    verdict.check(diff <= kGraphTolerance, "the graphed step's losses equal the eager step's",
                  course::format("largest relative difference %.2e over %d steps (tolerance %.0e)",
                                 diff, kGraphCheckSteps, kGraphTolerance));
  }
  for (const auto& run : runs) {
    verdict.check(results[run].accuracy >= bar, run + " run: test accuracy reaches the bar",
                  course::format("%.4f vs bar %.2f", results[run].accuracy, bar));
  }
}

}  // namespace lesson11

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson11.cpp and bench_training include this file
int main(int argc, char** argv) try {
  using namespace lesson11;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  int batch_size = static_cast<int>(kBatchSize), workers = kWorkers;
  std::string only = "all";
  course::Cli cli("lesson11_fast_training_loop",
                  "Lesson 11: lesson 05's loop made fast, one change at a time.", options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_option("--run", only, "which run to train (all: each in turn)",
                 {"all", "tutorial", "pinned", "resident", "flat", "graphed"});
  cli.add_option("--workers", workers, "threads loading batches (num_workers)", 0, kMaxWorkers);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  if (only == "graphed" && !device.is_cuda()) {
    verdict.waive("--run graphed needs a CUDA graph, and this run is on " + device.str());
    return verdict.finish("lesson 11 on " + device.str());
  }
  const auto folder = course::find_fashion_mnist(options.data_dir);
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  const course::ImageSet test = course::load_fashion_mnist(folder, /*train=*/false);
  if (options.quick) train = course::take(train, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  // kAccuracyBar is for a full run (all images, >= kEpochs, batches <= kBatchSize).
  const bool full_run = !options.quick && epochs >= kEpochs && batch_size <= kBatchSize;
  std::cout << "Fashion-MNIST: " << train.labels.size(0) << " training images ("
            << train.images.nbytes() / 1000000 << " MB as float32), " << test.labels.size(0)
            << " test; the tutorial's ANN, batch " << batch_size << ", " << workers
            << " loader workers, " << epochs << " epoch(s)\n";
  std::vector<std::string> runs = {only};
  if (only == "all") runs = {"tutorial", "pinned", "resident", "flat"};
  if (only == "all" && device.is_cuda()) runs.push_back("graphed");
  if (only == "all" && !device.is_cuda()) std::cout << "(graphed: skipped: needs CUDA)\n";
  compare_runs(runs, train, test, epochs, batch_size, workers,
               full_run ? kAccuracyBar : kQuickAccuracyBar, device, options.seed, verdict);
  return verdict.finish("lesson 11 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
