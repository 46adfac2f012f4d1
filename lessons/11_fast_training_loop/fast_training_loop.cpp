// Lesson 11 (going further) — a fast training loop: lesson 05's loop on Fashion-MNIST, then the
// changes that make it faster, run by run, each measured and checked against the one before.
//
// You will learn, run by run (--run NAME), in this order:
//   - "tutorial": lesson 05's loop, unchanged (from common/ann.h: the tutorial's ANN, LibTorch's
//     DataLoader with --workers threads, loss.item() every step, torch::max for the accuracy);
//   - "pinned": each batch gathered whole into pinned memory and copied non_blocking (--workers
//     threads gather ahead), and the loss summed on the device, read once per epoch;
//   - "resident": the whole dataset copied to the device once, each batch gathered there.
// (Lesson 12 then does the step in fewer operators; lesson 19 captures it in a CUDA graph.)
//
// Run:    build/bin/lesson11_fast_training_loop [--device ...] [--workers N] [--epochs N] [--quick]
//           [--run all|tutorial|pinned|resident] [--batch-size N] [--data-dir DIR]
// Checks: each run's test accuracy >= kAccuracyBar (kQuickAccuracyBar for shorter runs); each
//         form's losses equal the form's before it: pinned and tutorial (exactly on the CPU, within
//         kGpuTolerance on a GPU), resident and pinned (exactly, on the CPU). Exit 0 PASS, 1 FAIL,
//         2 bad flag or missing data, 130 Ctrl-C.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::index_select_out
#include <unistd.h>       // defines: isatty (the progress line only on a terminal)

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>

#include "common/ann.h"  // defines: ANN, make_train_loader, train_epoch, test_accuracy (lesson 05's)
#include "common/cli.h"        // defines: Cli, start_lesson
#include "common/compare.h"    // defines: tolerance_for
#include "common/data.h"       // defines: ImageSet, load_fashion_mnist_splits
#include "common/interrupt.h"  // defines: stop_requested (Ctrl-C)
#include "common/report.h"     // defines: EpochStats, run_epochs, print_timed_runs
#include "common/timing.h"     // defines: Stopwatch
#include "common/verdict.h"    // defines: Verdict, report_error
#include "prefetch.h"          // defines: Prefetcher (threads making items ahead, taken in order)

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
// On a GPU the same batches may round a last bit otherwise (another kernel for the gather), and
// training carries such bits on: ten times fp32's (common/compare.h).
constexpr double kGpuTolerance = 10 * course::tolerance_for(torch::kFloat);
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
  // >>> lab: move the model to `device`, then build Adam (kLearningRate) over its parameters
  trainer.model->to(device);  // model.to(device): every parameter moves, in place
  trainer.optimizer = std::make_unique<torch::optim::Adam>(  // then the optimizer, over them
      trainer.model->parameters(), torch::optim::AdamOptions(kLearningRate));
  // <<< lab
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

// ---- tutorial 002's loop: slices of one tensor, each moved as it is used ----------------------
//! [tutorial-002]
// for i in range(0, len(X_tensor), batch_size):
//     Xbatch = X_tensor[i:i+batch_size].to(device)
//     ybatch = y_tensor[i:i+batch_size].to(device); ...
// A slice is a view (nothing is copied; the last one is shorter, as in Python); .to(device) then
// copies it: one copy each step. The resident loader below moves the tensors to the device once,
// before the loop, and takes its batches where they already are.
template <typename Step>
void tutorial_002_epoch(const torch::Tensor& X_tensor, const torch::Tensor& y_tensor,
                        std::int64_t batch_size, const torch::Device& device, Step&& step) {
  for (std::int64_t i = 0; i < X_tensor.size(0); i += batch_size) {
    const torch::Tensor Xbatch = X_tensor.slice(/*dim=*/0, i, i + batch_size).to(device);
    const torch::Tensor ybatch = y_tensor.slice(/*dim=*/0, i, i + batch_size).to(device);
    step(Xbatch, ybatch);  // y_pred = class_model(Xbatch); loss = loss_fn(y_pred, ybatch); ...
  }
}
//! [tutorial-002]

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
    // As LibTorch's RandomSampler: an order drawn as the loader is made, and another as each
    // epoch starts; so one seed gives the DataLoader's batches.
    new_order();
  }
  void start_epoch() {
    ahead_.stop();  // the workers of an epoch left half-way read the old order: stop them first
    new_order();
    // DataLoader(num_workers=N, pin_memory=True) as threads (C++ has no interpreter lock): they
    // gather the next batches while this one trains; taken in order, the same batches as without.
    if (workers_ == 0 || resident_) return;
    const std::int64_t batches = (size() + batch_size_ - 1) / batch_size_;
    ahead_.start(batches, workers_, [this](std::int64_t k) { return gather(k); });
  }
  // The next batch (false at the end of the epoch). Resident, it is gathered into `batch`'s own
  // tensors when they have its size: no new allocation per step.
  bool next(Batch& batch) {
    if (cursor_ >= size()) return false;
    const std::int64_t k = cursor_ / batch_size_;
    cursor_ += batch_size_;
    if (resident_) {
      batch = gather(k, batch);  // a gather kernel on the device: no copy, no host work
      return true;
    }
    const Batch host = workers_ == 0 ? gather(k) : ahead_.take(k);  // pinned on CUDA
    // >>> lab: copy host's images and labels into `batch` on device_ (non_blocking if pinned_)
    batch.images = host.images.to(device_, /*non_blocking=*/pinned_);
    batch.labels = host.labels.to(device_, /*non_blocking=*/pinned_);
    // <<< lab
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
  Prefetcher<Batch> ahead_;  // last: its threads stop before what they read is gone
};
//! [loader]

// "  done/total samples" on one line of a terminal, rewritten in place (a carriage return) every
// `every`-th update() and cleared at the end; nothing when standard output is a file or a pipe.
class ProgressLine {
 public:
  explicit ProgressLine(std::int64_t total, bool enabled = isatty(STDOUT_FILENO) != 0,
                        std::int64_t every = 100)
      : total_(total), every_(every > 0 ? every : 1), enabled_(enabled) {}
  ~ProgressLine() {
    if (enabled_) std::printf("\r%40s\r", "");
    std::fflush(stdout);
  }
  ProgressLine(const ProgressLine&) = delete;  // one line on the terminal, cleared once
  ProgressLine& operator=(const ProgressLine&) = delete;
  void update(std::int64_t done) {
    if (!enabled_ || ++updates_ % every_ != 0) return;
    std::printf("\r  %6lld/%lld samples", static_cast<long long>(done),
                static_cast<long long>(total_));
    std::fflush(stdout);
  }

 private:
  std::int64_t total_, every_, updates_ = 0;
  bool enabled_;
};

//! [epoch]
// The tutorial's step, unchanged, on a batch the loader put on the device; its loss stays there.
torch::Tensor tutorial_step(Trainer& trainer, const Batch& batch) {
  torch::optim::Adam& optimizer = *trainer.optimizer;
  // >>> lab: zero the gradients the last step left
  optimizer.zero_grad();  // optimizer.zero_grad()
  // <<< lab
  const torch::Tensor loss =  // loss = criterion(model(features), labels)
      torch::nn::functional::cross_entropy(trainer.model->forward(batch.images), batch.labels);
  // >>> lab: backpropagate the loss, then let the optimizer take its step
  loss.backward();   // loss.backward()
  optimizer.step();  // optimizer.step()
  // <<< lab
  return loss.detach();
}

// One epoch of the tutorial's step, fed by this lesson's loader: the "pinned" and "resident" runs.
// The tutorial's total_loss += loss.item() waits for the GPU at every step: the sum stays on the
// device instead (in double, as Python's float), read once at the end. The resident loader reuses
// `batch`'s tensors.
EpochStats train_epoch_loaded(Trainer& trainer, Loader& loader, const torch::Device& device) {
  trainer.model->train();  // model.train()
  Batch batch;
  course::Stopwatch watch(device);
  ProgressLine line(loader.size());  // every 100 steps, on a terminal
  torch::Tensor loss_sum = torch::zeros({}, torch::dtype(torch::kDouble).device(device));
  std::int64_t steps = 0, seen = 0;
  loader.start_epoch();
  while (loader.next(batch)) {  // each batch on the device
    // >>> lab: add the step's loss to loss_sum, on the device: no .item() in the loop
    loss_sum += tutorial_step(trainer, batch);
    // <<< lab
    ++steps;
    seen += batch.labels.size(0);
    if (course::stop_requested()) break;  // Ctrl-C: the step is whole; stop here (lesson 10)
    line.update(seen);
  }
  const double total_loss = loss_sum.item<double>();  // the one wait for the GPU, per epoch
  return {total_loss / static_cast<double>(steps), watch.seconds(), seen, seen < loader.size()};
}
//! [epoch]

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
  // Each epoch in turn, as course::run_epochs prints them; Ctrl-C ends the step under way, then
  // the run.
  const auto train_epochs = [&](const std::function<EpochStats()>& epoch) {
    return course::run_epochs(run, epochs, samples, epoch,
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
  } else {
    throw course::UsageError("no run '" + run + "'", "use tutorial, pinned or resident");
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
  // Each form against the form before it, from the same seed: their epoch losses.
  const auto same_losses = [&](const std::string& a, const std::string& b, double tolerance,
                               const std::string& why) {
    const double diff = course::max_loss_difference(results[a].epochs, results[b].epochs);
    verdict.check(diff <= tolerance, a + " trains as " + b + ": " + why,
                  course::format("epoch losses within %.2e (tolerance %.0e)", diff, tolerance));
  };
  if (ran("pinned") && ran("tutorial"))  // same batches, same steps (a GPU may round otherwise)
    same_losses("pinned", "tutorial", device.is_cpu() ? 0.0 : kGpuTolerance, "same batches");
  if (ran("resident") && ran("pinned") && device.is_cpu())  // a GPU draws another order
    same_losses("resident", "pinned", 0.0, "on the CPU both loaders give the same batches");
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
                  "Lesson 11: lesson 05's loop made fast, run by run.", options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_option("--run", only, "which run to train (all: each in turn)",
                 {"all", "tutorial", "pinned", "resident"});
  cli.add_option("--workers", workers, "threads loading batches (num_workers)", 0, kMaxWorkers);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  // kAccuracyBar is for a full run (all images, >= kEpochs, batches <= kBatchSize).
  const bool full_run = !options.quick && epochs >= kEpochs && batch_size <= kBatchSize;
  std::cout << "Fashion-MNIST: " << train.labels.size(0) << " training images ("
            << train.images.nbytes() / 1000000 << " MB as float32), " << test.labels.size(0)
            << " test; the tutorial's ANN, batch " << batch_size << ", " << workers
            << " loader workers, " << epochs << " epoch(s)\n";
  std::vector<std::string> runs = {only};
  if (only == "all") runs = {"tutorial", "pinned", "resident"};
  compare_runs(runs, train, test, epochs, batch_size, workers,
               full_run ? kAccuracyBar : kQuickAccuracyBar, device, options.seed, verdict);
  return verdict.finish("lesson 11 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
