// Lesson 05 — a GPU-aware training loop on Fashion-MNIST, done right, with two data loaders and,
// on CUDA, the whole step captured in a CUDA graph.
//
// You will learn:
//   - the order that matters: model to the device once, THEN build the optimizer; each batch to
//     the device inside the loop;
//   - keep the loop free of synchronizations: accumulate the loss on the device and read it
//     with .item() once per epoch, not once per step (each .item() waits for the GPU);
//   - the textbook loader ("batches": gather on the host, copy each batch, pinned and
//     non_blocking on CUDA) against a dataset resident on the device ("resident": one copy,
//     then batches are sliced on the device by a shuffled index tensor). For a dataset this size
//     the resident loader removes all per-batch host work and copies;
//   - a small model's step is dominated by overheads: LibTorch's Adam runs eight kernels per
//     parameter tensor, so the lesson keeps all parameters in one flat tensor (and all gradients
//     in another) and the optimizer updates them with eight kernels in all;
//   - on a GPU the step's kernel launches are what is left: "graphed" captures the whole step
//     (forward, backward, an Adam whose step count lives on the device) in a CUDA graph once and
//     replays it for every batch, checked against the same step run eagerly.
//
// Run:    build/bin/lesson05_training_loop [--device ...] [--loader all|batches|resident|graphed]
//                                          [--epochs N] [--batch-size N] [--data-dir DIR] [--quick]
// Checks: test accuracy >= kAccuracyBar after kEpochs (kQuickAccuracyBar with --quick, fewer
//         epochs or larger batches) for each loader trained; on the CPU, both loaders see the
//         same batches and so reach the same loss; on CUDA, the graphed step's losses equal the
//         eager step's (kGraphTolerance). Exit 0 PASS, 1 FAIL, 2 bad flag or missing data, 77
//         waived (--loader graphed without CUDA), 130 stopped by Ctrl-C (at the end of a step).
#include "training_loop.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>

#ifdef GPU_LESSONS_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>     // defines: at::cuda::CUDAEvent (orders two streams)
#include <ATen/cuda/CUDAGraph.h>     // defines: at::cuda::CUDAGraph (capture, replay)
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_synchronize
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getStreamFromPool
#endif

#include "common/cli.h"     // defines: Cli, start_lesson
#include "common/device.h"  // defines: cuda_device_count, why_no_cuda
#include "common/interrupt.h"  // defines: StopOnInterrupt, stop_requested, Interrupted
#include "common/timing.h"  // defines: Stopwatch, median
#include "common/verdict.h" // defines: Verdict

namespace lesson05 {

constexpr std::int64_t kPixels = 28 * 28;

MlpImpl::MlpImpl() {
  fc1 = register_module("fc1", torch::nn::Linear(kPixels, 128));
  fc2 = register_module("fc2", torch::nn::Linear(128, 64));
  fc3 = register_module("fc3", torch::nn::Linear(64, 10));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
}

// ---- the two loaders ---------------------------------------------------------------------------
namespace {

//! [batches-loader]
class BatchesLoader final : public Loader {
 public:
  BatchesLoader(const course::ImageSet& data, std::int64_t batch_size, const torch::Device& device)
      : images_(data.images.reshape({-1, kPixels}).contiguous()),
        labels_(data.labels),
        batch_size_(batch_size),
        device_(device),
        pinned_(device.is_cuda()) {}

  void start_epoch() override {
    order_ = torch::randperm(size(), torch::kLong);  // the order lives on the host
    cursor_ = 0;
  }

  bool next(Batch& batch) override {
    if (cursor_ >= size()) return false;
    const torch::Tensor idx = order_.slice(0, cursor_, cursor_ + batch_size_);
    cursor_ += batch_size_;
    const std::int64_t n = idx.size(0);
    // On CUDA the CPU gathers the batch straight into page-locked (pinned) memory: the copy
    // engine reads it directly, so the copy below is asynchronous and overlaps the CPU's work on
    // the next batch. The buffers are reused, not pinned anew: LibTorch's pinned-memory allocator
    // caches freed blocks, and records an event on each non_blocking copy so that a block is
    // handed out again only once the copy reading it has finished.
    torch::Tensor images = torch::empty({n, kPixels}, images_.options().pinned_memory(pinned_));
    torch::Tensor labels = torch::empty({n}, labels_.options().pinned_memory(pinned_));
    torch::index_select_out(images, images_, 0, idx);  // gathered by the CPU
    torch::index_select_out(labels, labels_, 0, idx);
    // >>> lab: copy images and labels into `batch` on device_ (non_blocking if pinned_)
    batch.images = images.to(device_, /*non_blocking=*/pinned_);
    batch.labels = labels.to(device_, /*non_blocking=*/pinned_);
    // <<< lab
    return true;
  }

  std::int64_t size() const override { return images_.size(0); }
  std::string name() const override { return "batches"; }

 private:
  torch::Tensor images_, labels_, order_;
  std::int64_t batch_size_;
  torch::Device device_;
  bool pinned_;
  std::int64_t cursor_ = 0;
};
//! [batches-loader]

//! [resident-loader]
class ResidentLoader final : public Loader {
 public:
  ResidentLoader(const course::ImageSet& data, std::int64_t batch_size, const torch::Device& device)
      // One copy of the whole dataset (188 MB as float32) to the device, up front.
      : images_(data.images.reshape({-1, kPixels}).to(device).contiguous()),
        labels_(data.labels.to(device)),
        batch_size_(batch_size),
        device_(device) {}

  void start_epoch() override {
    // The shuffled order is made on the device too: nothing crosses the host-device link.
    order_ = torch::randperm(size(), torch::TensorOptions().dtype(torch::kLong).device(device_));
    cursor_ = 0;
  }

  bool next(Batch& batch) override {
    batch = Batch{};  // new tensors
    return next_into(batch);
  }

  bool next_into(Batch& batch) override {
    if (cursor_ >= size()) return false;
    const torch::Tensor idx = order_.slice(0, cursor_, cursor_ + batch_size_);
    cursor_ += batch_size_;
    if (batch.labels.defined() && batch.labels.size(0) == idx.size(0)) {
      torch::index_select_out(batch.images, images_, 0, idx);  // the gather writes in place
      torch::index_select_out(batch.labels, labels_, 0, idx);
    } else {
      batch.images = images_.index_select(0, idx);  // a gather kernel on the device
      batch.labels = labels_.index_select(0, idx);
    }
    return true;
  }

  std::int64_t size() const override { return images_.size(0); }
  std::string name() const override { return "resident"; }

 private:
  torch::Tensor images_, labels_, order_;
  std::int64_t batch_size_;
  torch::Device device_;
  std::int64_t cursor_ = 0;
};
//! [resident-loader]

}  // namespace

bool Loader::next_into(Batch& batch) {
  Batch fresh;
  if (!next(fresh)) return false;
  if (batch.labels.defined() && batch.labels.size(0) == fresh.labels.size(0)) {
    batch.images.copy_(fresh.images);
    batch.labels.copy_(fresh.labels);
  } else {
    batch = fresh;
  }
  return true;
}

std::unique_ptr<Loader> make_batches_loader(const course::ImageSet& data, std::int64_t batch_size,
                                            const torch::Device& device) {
  return std::make_unique<BatchesLoader>(data, batch_size, device);
}

std::unique_ptr<Loader> make_resident_loader(const course::ImageSet& data,
                                             std::int64_t batch_size, const torch::Device& device) {
  return std::make_unique<ResidentLoader>(data, batch_size, device);
}

std::unique_ptr<Loader> make_loader(const std::string& name, const course::ImageSet& data,
                                    std::int64_t batch_size, const torch::Device& device) {
  if (name == "batches") return make_batches_loader(data, batch_size, device);
  if (name == "resident") return make_resident_loader(data, batch_size, device);
  throw course::UsageError("unknown loader '" + name + "'", "use batches or resident");
}

// ---- training ----------------------------------------------------------------------------------
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
//! [flatten]

//! [make-trainer]
Trainer make_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);
  Trainer trainer;
  // >>> lab: move the model, flatten its parameters, then build Adam over trainer.flat.values
  trainer.model->to(device);                               // 1. the model moves once,
  trainer.flat = flatten_parameters(*trainer.model);       // 2. its parameters become one tensor,
  trainer.optimizer = std::make_unique<torch::optim::Adam>(  // 3. and the optimizer comes last
      std::vector<torch::Tensor>{trainer.flat.values}, torch::optim::AdamOptions(kLearningRate));
  // <<< lab
  return trainer;
}
//! [make-trainer]

namespace {
// An epoch's figures from the loss summed on the device: the one sync of the epoch.
EpochStats epoch_stats(const torch::Tensor& loss_sum, std::int64_t seen,
                       const course::Stopwatch& watch, const Loader& loader) {
  EpochStats stats;
  stats.mean_loss = loss_sum.item<double>() / static_cast<double>(seen);  // one sync per epoch
  stats.seconds = watch.seconds();
  stats.samples = seen;
  stats.interrupted = seen < loader.size();
  return stats;
}
}  // namespace

//! [train-epoch]
EpochStats train_epoch(Trainer& trainer, Loader& loader, const torch::Device& device,
                       bool progress) {
  Mlp& model = trainer.model;
  model->train();
  course::Stopwatch watch(device);
  // The running loss stays on the device: adding to it queues a kernel, reading it would wait.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  std::int64_t seen = 0;
  Batch batch;
  loader.start_epoch();
  while (loader.next(batch)) {
    // >>> lab: zero every gradient (they all live in trainer.flat.gradients)
    trainer.flat.gradients.zero_();  // zero_grad() for all parameters in one kernel
    // <<< lab
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(model->forward(batch.images), batch.labels);
    // >>> lab: backpropagate the loss, then let the optimizer take its step
    loss.backward();
    trainer.optimizer->step();
    // <<< lab
    const std::int64_t n = batch.labels.size(0);
    loss_sum += loss.detach() * static_cast<double>(n);
    seen += n;
    if (course::stop_requested()) break;  // Ctrl-C: the step is whole; stop here (lesson 10)
    if (progress && (seen / n) % 100 == 0) {
      std::printf("\r  %6lld/%lld samples", static_cast<long long>(seen),
                  static_cast<long long>(loader.size()));
      std::fflush(stdout);
    }
  }
  if (progress) std::printf("\r%40s\r", "");
  return epoch_stats(loss_sum, seen, watch, loader);
}
//! [train-epoch]

// ---- the whole step in a CUDA graph ----------------------------------------------------------------
//! [device-adam]
DeviceAdam::DeviceAdam(const FlatParameters& flat, double lr)
    : values_(flat.values),
      gradients_(flat.gradients),
      exp_avg_(torch::zeros_like(flat.values)),
      exp_avg_sq_(torch::zeros_like(flat.values)),
      denom_(torch::empty_like(flat.values)),
      steps_(torch::zeros({}, flat.values.options().dtype(torch::kDouble))),
      bias1_(torch::empty_like(steps_)),
      bias2_(torch::empty_like(steps_)),
      lr_(lr) {}

void DeviceAdam::step() {
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
//! [device-adam]

torch::Tensor device_adam_step(Mlp& model, const FlatParameters& flat, DeviceAdam& adam,
                               const torch::Tensor& images, const torch::Tensor& labels) {
  flat.gradients.zero_();
  const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
  loss.backward();
  adam.step();
  return loss.detach();
}

//! [graphed-step]
#ifdef GPU_LESSONS_WITH_CUDA
struct GraphedStep::Impl {
  Impl(const Mlp& model, const FlatParameters& flat, DeviceAdam& adam, c10::DeviceIndex device)
      : model(model), flat(flat), adam(adam), stream(c10::cuda::getStreamFromPool(false, device)) {}
  Mlp model;
  FlatParameters flat;
  DeviceAdam& adam;
  c10::cuda::CUDAStream stream;  // capture never runs on the default stream
  at::cuda::CUDAGraph graph;
  int calls = 0;
  bool captured = false;
};
#else
struct GraphedStep::Impl {};
#endif

GraphedStep::GraphedStep(Mlp& model, const FlatParameters& flat, DeviceAdam& adam,
                         std::int64_t batch_size, const torch::Device& device) {
#ifdef GPU_LESSONS_WITH_CUDA
  if (!device.is_cuda()) {
    throw course::CourseError("a CUDA graph needs a CUDA device, not " + device.str(),
                              "run with --device cuda on a machine with a GPU");
  }
  impl_ = std::make_unique<Impl>(model, flat, adam, device.index());
  // The graph reads and writes these very tensors at every replay: made once, before capture.
  const auto on = torch::TensorOptions().device(device);
  batch.images = torch::zeros({batch_size, kPixels}, on);
  batch.labels = torch::zeros({batch_size}, on.dtype(torch::kLong));
  loss = torch::zeros({}, on);
#else
  (void)model, (void)flat, (void)adam, (void)batch_size;
  throw course::CourseError("a CUDA graph needs CUDA, and " + course::why_no_cuda() + " (" +
                                device.str() + ")",
                            "run with --device cuda on a machine with a GPU");
#endif
}

GraphedStep::~GraphedStep() = default;

bool GraphedStep::captured() const {
#ifdef GPU_LESSONS_WITH_CUDA
  return impl_->captured;
#else
  return false;
#endif
}

void GraphedStep::step() {
#ifdef GPU_LESSONS_WITH_CUDA
  Impl& g = *impl_;
  if (g.captured) {
    g.graph.replay();  // the whole step: one launch, on the current stream
    return;
  }
  // Warm-up and capture run on a side stream, after what the current stream queued (the batch).
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(g.stream.device_index());
  at::cuda::CUDAEvent batch_ready, step_done;
  batch_ready.record(current);
  batch_ready.block(g.stream);
  const bool capture = g.calls++ >= kGraphWarmupSteps;
  // The warm-up steps are real steps: they let autograd, cuBLAS and the caching allocator make
  // everything they make once (workspaces, handles) before the capture, which must not.
  if (capture) c10::cuda::device_synchronize();
  {
    c10::cuda::CUDAStreamGuard on_side_stream(g.stream);
    if (capture) g.graph.capture_begin();  // from here kernels are recorded, not run
    loss.copy_(device_adam_step(g.model, g.flat, g.adam, batch.images, batch.labels));
    if (capture) g.graph.capture_end();
  }
  step_done.record(g.stream);
  step_done.block(current);
  if (capture) {
    g.captured = true;
    g.graph.replay();  // the captured step has not run yet: run it
  }
#endif
}
//! [graphed-step]

//! [train-epoch-graphed]
EpochStats train_epoch_graphed(Mlp& model, const FlatParameters& flat, DeviceAdam& adam,
                               GraphedStep& graph, Loader& loader, const torch::Device& device) {
  model->train();
  course::Stopwatch watch(device);
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  std::int64_t seen = 0;
  Batch batch = graph.batch;  // the graph's own tensors: the loader gathers into them
  loader.start_epoch();
  while (loader.next_into(batch)) {
    const std::int64_t n = batch.labels.size(0);
    if (batch.images.is_same(graph.batch.images)) {
      graph.step();  // a full batch: replay the graph
      loss_sum += graph.loss * static_cast<double>(n);
    } else {  // the shorter last batch: a graph has fixed shapes, so the same step, eagerly
      loss_sum += device_adam_step(model, flat, adam, batch.images, batch.labels) *
                  static_cast<double>(n);
    }
    seen += n;
    if (course::stop_requested()) break;
  }
  return epoch_stats(loss_sum, seen, watch, loader);
}
//! [train-epoch-graphed]

double graphed_vs_eager(const course::ImageSet& data, std::int64_t batch_size,
                        const torch::Device& device, std::uint64_t seed, int steps) {
  Trainer eager = make_trainer(device, seed), graphed = make_trainer(device, seed);
  DeviceAdam eager_adam(eager.flat, kLearningRate), graphed_adam(graphed.flat, kLearningRate);
  GraphedStep graph(graphed.model, graphed.flat, graphed_adam, batch_size, device);
  const torch::Tensor images = data.images.reshape({-1, kPixels}).to(device);
  const torch::Tensor labels = data.labels.to(device);
  const std::int64_t batches = images.size(0) / batch_size;
  torch::Tensor worst = torch::zeros({}, torch::TensorOptions().device(device));
  for (int i = 0; i < steps; ++i) {
    const std::int64_t start = (i % batches) * batch_size;
    const torch::Tensor x = images.slice(0, start, start + batch_size);
    const torch::Tensor y = labels.slice(0, start, start + batch_size);
    const torch::Tensor expected = device_adam_step(eager.model, eager.flat, eager_adam, x, y);
    graph.batch.images.copy_(x);
    graph.batch.labels.copy_(y);
    graph.step();
    worst = torch::maximum(worst, ((graph.loss - expected).abs() / expected.abs()));
  }
  return worst.item<double>();  // one sync, at the end
}

//! [evaluate]
double evaluate(Mlp& model, const course::ImageSet& data, const torch::Device& device) {
  model->eval();
  // >>> lab: evaluation needs no graph: turn gradient recording off for this function
  torch::NoGradGuard no_grad;  // no graph: less memory, less work (lesson 06)
  // <<< lab
  const torch::Tensor images = data.images.reshape({-1, kPixels});
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (std::int64_t start = 0; start < images.size(0); start += kEvalBatch) {
    const torch::Tensor x = images.slice(0, start, start + kEvalBatch).to(device);
    const torch::Tensor y = data.labels.slice(0, start, start + kEvalBatch).to(device);
    correct += model->forward(x).argmax(1).eq(y).sum();
  }
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(images.size(0));
}
//! [evaluate]

course::ImageSet take(const course::ImageSet& data, std::int64_t n) {
  return {data.images.slice(0, 0, n), data.labels.slice(0, 0, n)};
}

//! [run]
RunResult train_and_evaluate(const course::ImageSet& train, const course::ImageSet& test,
                             const std::string& loader_name, int epochs, std::int64_t batch_size,
                             const torch::Device& device, std::uint64_t seed, bool progress) {
  Trainer trainer = make_trainer(device, seed);
  const bool graphed = loader_name == "graphed";
  auto loader = make_loader(graphed ? "resident" : loader_name, train, batch_size, device);
  std::unique_ptr<DeviceAdam> adam;
  std::unique_ptr<GraphedStep> graph;
  if (graphed) {  // the same model, with Adam's step count on the device, and one graph
    adam = std::make_unique<DeviceAdam>(trainer.flat, kLearningRate);
    graph = std::make_unique<GraphedStep>(trainer.model, trainer.flat, *adam, batch_size, device);
  }
  course::StopOnInterrupt stop_on_ctrl_c;  // Ctrl-C ends the step under way, then the run
  RunResult result;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    result.epochs.push_back(
        graphed ? train_epoch_graphed(trainer.model, trainer.flat, *adam, *graph, *loader, device)
                : train_epoch(trainer, *loader, device, progress));
    const EpochStats& s = result.epochs.back();
    if (s.interrupted) {
      throw course::Interrupted(loader_name + " loader, epoch " + std::to_string(epoch + 1) + " of " +
                                std::to_string(epochs) + ", after " + std::to_string(s.samples) +
                                " of " + std::to_string(loader->size()) +
                                " samples; nothing is saved (lesson 10 saves and resumes runs)");
    }
    std::printf("  %-8s epoch %d/%d  loss %.4f  %6.3f s  %9.0f samples/s\n", loader_name.c_str(),
                epoch + 1, epochs, s.mean_loss, s.seconds, s.samples_per_second());
    std::fflush(stdout);  // a line per epoch, also through a pipe (| tee)
  }
  result.accuracy = evaluate(trainer.model, test, device);
  return result;
}
//! [run]

}  // namespace lesson05

// ---- main ----------------------------------------------------------------------------------------
namespace {

// Median seconds per epoch: the first epoch also pays for warm-up (allocator, kernel choice).
double median_epoch_seconds(const lesson05::RunResult& run) {
  std::vector<double> seconds;
  for (const auto& e : run.epochs) seconds.push_back(e.seconds);
  return course::median(seconds);
}

}  // namespace

int lesson_main(int argc, char** argv) {
  using namespace lesson05;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  int batch_size = static_cast<int>(kBatchSize);
  std::string loader = "all";
  course::Cli cli("lesson05_training_loop",
                  "Lesson 05: a GPU-aware training loop on Fashion-MNIST, two data loaders and "
                  "(CUDA) the whole step in a CUDA graph.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_option("--loader", loader,
                 "which loader to train with (graphed: the resident one feeding a CUDA graph)",
                 {"all", "batches", "resident", "graphed"});
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  if (loader == "graphed" && !device.is_cuda()) {
    verdict.waive("--loader graphed captures the step in a CUDA graph, and this run is on " +
                  device.str());
    return verdict.finish("lesson 05 on " + device.str());
  }

  const auto folder = course::find_fashion_mnist(options.data_dir);
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  const course::ImageSet test = course::load_fashion_mnist(folder, /*train=*/false);
  if (options.quick) train = take(train, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  // The 0.85 bar is for the full run (all images, >= 5 epochs, batches of <= 64); a shorter run
  // (fewer epochs or steps) is held to the quick bar.
  const bool full_run = !options.quick && epochs >= kEpochs && batch_size <= kBatchSize;
  const double bar = full_run ? kAccuracyBar : kQuickAccuracyBar;
  std::cout << "Fashion-MNIST: " << train.labels.size(0) << " training, " << test.labels.size(0)
            << " test images; MLP 784-128-64-10, Adam lr " << kLearningRate << ", batch "
            << batch_size << ", " << epochs << " epoch(s)\n";

  const bool progress = isatty(STDOUT_FILENO) != 0;
  std::vector<std::string> loaders = {loader};
  if (loader == "all") {
    loaders = {"batches", "resident"};
    if (device.is_cuda()) loaders.push_back("graphed");
  }
  std::map<std::string, RunResult> runs;
  for (const auto& name : loaders) {
    runs[name] = train_and_evaluate(train, test, name, epochs, batch_size, device, options.seed,
                                    progress);
  }
  if (loader == "all" && !device.is_cuda()) {
    std::cout << "  graphed  (skipped: needs CUDA) the whole step captured in a CUDA graph\n";
  }

  std::cout << "\nloader     s/epoch (median)   samples/s   test accuracy\n";
  for (const auto& name : loaders) {
    const double s = median_epoch_seconds(runs[name]);
    std::printf("%-10s %10.3f %16.0f %12.4f\n", name.c_str(), s,
                static_cast<double>(train.labels.size(0)) / s, runs[name].accuracy);
  }
  const auto speed_up = [&](const std::string& fast, const std::string& slow) {
    if (runs.count(fast) && runs.count(slow)) {
      std::printf("%s is %.2fx the speed of %s on %s\n", fast.c_str(),
                  median_epoch_seconds(runs[slow]) / median_epoch_seconds(runs[fast]), slow.c_str(),
                  device.str().c_str());
    }
  };
  speed_up("resident", "batches");
  speed_up("graphed", "resident");
  if (device.is_cpu() && runs.count("batches") && runs.count("resident")) {
    // Same seed, same permutations, same batches: the two loaders must agree exactly.
    const double a = runs["batches"].epochs.back().mean_loss;
    const double b = runs["resident"].epochs.back().mean_loss;
    verdict.check(a == b, "on the CPU both loaders give the same batches, hence the same loss",
                  "last-epoch loss " + std::to_string(a) + " vs " + std::to_string(b));
  }
  if (runs.count("graphed")) {
    // A graph replays every host number as it was at capture: a step count kept on the host
    // would replay step 4's bias corrections at every step. Same batches, eager and graphed:
    const double diff = graphed_vs_eager(train, batch_size, device, options.seed, kGraphCheckSteps);
    char evidence[96];
    std::snprintf(evidence, sizeof evidence, "largest relative difference %.2e over %d steps (tolerance %.0e)",
                  diff, kGraphCheckSteps, kGraphTolerance);
    verdict.check(diff <= kGraphTolerance, "the graphed step's losses equal the eager step's",
                  evidence);
  }
  for (const auto& name : loaders) {
    char evidence[64];
    std::snprintf(evidence, sizeof evidence, "%.4f vs bar %.2f", runs[name].accuracy, bar);
    verdict.check(runs[name].accuracy >= bar, name + " loader: test accuracy reaches the bar",
                  evidence);
  }
  return verdict.finish("lesson 05 on " + device.str());
}
