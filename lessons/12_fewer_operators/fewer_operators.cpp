// Lesson 12 (going further) — fewer operators per step: lesson 11's fastest loop (the dataset on
// the device, the loss kept there), its step then done in fewer ATen operators, one change at a
// time, each measured and checked against the one before. On a GPU each operator is a kernel the
// host launches; on a CPU, microseconds of dispatch: a small model's step costs what its
// operators cost.
//
// You will learn, run by run (--run NAME), in this order:
//   - "resident": the tutorial's step (autograd, zero_grad, Adam over the model's six parameter
//     tensors) on lesson 11's resident batches;
//   - "flat": all parameters in one tensor: Adam in a handful of kernels, not several per tensor;
//   - "manual": the backward pass written out as matrix products, no autograd;
//   - to count the operators of a step (LibTorch's RecordFunction callbacks).
// (Lesson 19 captures a step in a CUDA graph; lesson 21 fuses the manual step further and
// captures a whole epoch.)
//
// Run:    build/bin/lesson12_fewer_operators [--device ...] [--epochs N] [--quick]
//           [--run all|resident|flat|manual] [--batch-size N] [--data-dir DIR]
// Checks: each form's step dispatches fewer operators than the form's before it; each run's test
//         accuracy >= kAccuracyBar (kQuickAccuracyBar for shorter runs); flat's epoch losses equal
//         resident's (kFlatTolerance); manual's gradients for one step equal flat's (fp32's
//         tolerance). Exit 0 PASS, 1 FAIL, 2 bad flag or missing data, 130 Ctrl-C.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::mm_out, torch::index_select_out

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>

#include "common/ann.h"              // defines: ANN, test_accuracy (lesson 05's)
#include "common/cli.h"              // defines: Cli, start_lesson
#include "common/compare.h"          // defines: tolerance_for, max_rel_diff
#include "common/data.h"             // defines: ImageSet, load_fashion_mnist_splits
#include "common/flat_parameters.h"  // defines: FlatParameters, flatten_parameters
#include "common/interrupt.h"        // defines: stop_requested (Ctrl-C)
#include "common/report.h"           // defines: EpochStats, run_epochs, print_timed_runs
#include "common/timing.h"           // defines: Stopwatch, count_operators
#include "common/verdict.h"          // defines: Verdict, report_error

namespace lesson12 {

// ---- knobs -----------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 5;       // lesson 05's: the first weights and the batches' order
constexpr int kEpochs = 5;               // the tutorial's: for epoch in range(5)
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr double kAccuracyBar = 0.85;    // test accuracy after kEpochs on all 60,000 images
// --quick: one epoch on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
constexpr std::int64_t kPixels = 28 * 28;
// The flat step does Adam's arithmetic on each element, but a kernel that vectorizes may round a
// last bit otherwise, and training carries such bits on: ten times fp32's (common/compare.h).
constexpr double kFlatTolerance = 10 * course::tolerance_for(torch::kFloat);
//! [knobs]

using course::ANN;         // the tutorial's ANN (fc1, fc2, out): one seed, lesson 05's weights
using course::EpochStats;  // an epoch's mean loss, seconds, samples, and whether Ctrl-C stopped it

// ---- the batches: lesson 11's resident loader, in brief ----------------------------------------
//! [batches]
struct Batch {  // float32 images [B, 784] and int64 labels [B], on the training device
  torch::Tensor images, labels;
};

// The dataset copied to the device once; each batch gathered there by two index_selects, in an
// order drawn on the device. As LibTorch's RandomSampler, an order is drawn as the batches are
// made and another as each epoch starts: on the CPU, from one seed, lesson 05's batches.
class ResidentBatches {
 public:
  ResidentBatches(const course::ImageSet& data, std::int64_t batch_size,
                  const torch::Device& device)
      : images_(data.images.reshape({-1, kPixels}).to(device).contiguous()),
        labels_(data.labels.to(device)),
        batch_size_(batch_size) {
    new_order();
  }
  void start_epoch() { new_order(); }
  // The next batch (false at the end of the epoch), gathered into `batch`'s own tensors when they
  // have its size, as lesson 11's: no new allocation per step.
  bool next(Batch& batch) {
    if (cursor_ >= size()) return false;
    const torch::Tensor idx = order_.slice(0, cursor_, cursor_ + batch_size_);
    cursor_ += batch_size_;
    if (!batch.labels.defined() || batch.labels.size(0) != idx.size(0)) {
      batch = {torch::empty({idx.size(0), kPixels}, images_.options()),
               torch::empty({idx.size(0)}, labels_.options())};
    }
    torch::index_select_out(batch.images, images_, 0, idx);
    torch::index_select_out(batch.labels, labels_, 0, idx);
    return true;
  }
  std::int64_t size() const { return labels_.size(0); }

 private:
  void new_order() {
    order_ = torch::randperm(size(), torch::dtype(torch::kLong).device(images_.device()));
    cursor_ = 0;
  }
  torch::Tensor images_, labels_, order_;
  std::int64_t batch_size_, cursor_ = 0;
};

// One epoch: `step` trains on each batch and returns its loss, summed on the device (lesson 11:
// no .item() in the loop) and read once at the end.
EpochStats run_epoch(ResidentBatches& batches, const torch::Device& device,
                     const std::function<torch::Tensor(const Batch&)>& step) {
  Batch batch;
  course::Stopwatch watch(device);  // waits for the GPU before it reads the clock
  torch::Tensor loss_sum = torch::zeros({}, torch::dtype(torch::kDouble).device(device));
  std::int64_t steps = 0, seen = 0;
  batches.start_epoch();
  while (batches.next(batch)) {
    loss_sum += step(batch);
    ++steps;
    seen += batch.labels.size(0);
    if (course::stop_requested()) break;  // Ctrl-C: the step is whole; stop here (lesson 10)
  }
  const double total_loss = loss_sum.item<double>();  // the one wait for the GPU, per epoch
  return {total_loss / static_cast<double>(steps), watch.seconds(), seen, seen < batches.size()};
}
//! [batches]

// ---- 1. "resident": the tutorial's step --------------------------------------------------------
//! [tutorial-step]
struct Trainer {  // model = ANN().to(device); optimizer = optim.Adam(model.parameters(), lr=1e-3)
  ANN model;
  std::unique_ptr<torch::optim::Adam> optimizer;
};

Trainer make_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // every run starts from the same weights
  Trainer trainer;
  trainer.model->to(device);
  trainer.optimizer = std::make_unique<torch::optim::Adam>(
      trainer.model->parameters(), torch::optim::AdamOptions(kLearningRate));
  return trainer;
}

// The tutorial's step, unchanged, on a batch already on the device; its loss stays there.
torch::Tensor tutorial_step(Trainer& trainer, const Batch& batch) {
  trainer.optimizer->zero_grad();  // optimizer.zero_grad()
  const torch::Tensor loss =       // loss = criterion(model(features), labels)
      torch::nn::functional::cross_entropy(trainer.model->forward(batch.images), batch.labels);
  loss.backward();            // loss.backward()
  trainer.optimizer->step();  // optimizer.step()
  return loss.detach();
}
//! [tutorial-step]

// ---- 2. "flat": all parameters in one tensor ----------------------------------------------------
// The model's parameters moved into one tensor, their gradients into another: from
// common/flat_parameters.h (lesson 20 profiles this step too).
using course::FlatParameters;      // values, and gradients: values.grad()
using course::flatten_parameters;  // each parameter becomes a view into values

//! [flat-trainer]
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
//! [flat-trainer]

//! [flat-step]
torch::Tensor flat_step(FlatTrainer& trainer, const Batch& batch) {
  // >>> lab: zero every parameter's gradient at once: they all live in trainer.flat.gradients
  trainer.flat.gradients.zero_();  // zero_grad() for every parameter: one kernel
  // <<< lab
  const torch::Tensor loss =
      torch::nn::functional::cross_entropy(trainer.model->forward(batch.images), batch.labels);
  loss.backward();            // each gradient lands in trainer.flat.gradients
  trainer.optimizer->step();  // Adam over one tensor: a handful of kernels in all
  return loss.detach();
}

// The flat epoch checks first that every gradient is still a view into the flat gradient tensor,
// where Adam reads it. A zero_grad() on the parameters breaks that: LibTorch 2.x sets each
// gradient to none and backward makes new ones that Adam never sees (1.13 refuses it). The
// "manual" run gives its own `step`.
EpochStats train_epoch_flat(FlatTrainer& trainer, ResidentBatches& batches,
                            const torch::Device& device,
                            std::function<torch::Tensor(const Batch&)> step = {}) {
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
  if (!step) step = [&](const Batch& batch) { return flat_step(trainer, batch); };
  return run_epoch(batches, device, step);
}
//! [flat-step]

// ---- 3. "manual": the backward pass written out, no autograd ------------------------------------
//! [manual-step]
// Autograd records each operator of the forward pass, then runs each one's derivative backwards,
// making every gradient anew and adding it into .grad(). For the tutorial's three Linear layers
// the whole backward pass is known beforehand: five matrix products and three sums (the images
// need no gradient), each gradient written straight into the flat gradient tensor. The same
// numbers, fewer operators, no graph.
torch::Tensor manual_step(FlatTrainer& trainer, const Batch& batch) {
  torch::NoGradGuard no_grad;  // nothing to record: backward is written out below
  ANN& model = trainer.model;
  const torch::Tensor& x = batch.images;  // [B, 784]
  // Forward, as ANN::forward, keeping what backward needs: each layer's input.
  const torch::Tensor h1 = torch::addmm(model->fc1->bias, x, model->fc1->weight.t()).relu_();
  const torch::Tensor h2 = torch::addmm(model->fc2->bias, h1, model->fc2->weight.t()).relu_();
  const torch::Tensor logits = torch::addmm(model->out->bias, h2, model->out->weight.t());
  const torch::Tensor log_probs = torch::log_softmax(logits, /*dim=*/1);
  const torch::Tensor loss = torch::nll_loss(log_probs, batch.labels);  // = cross_entropy
  // Backward. The loss's gradient with respect to the logits: (softmax - one_hot(labels)) / B.
  const torch::Tensor d_out =
      log_probs.exp().sub_(torch::one_hot(batch.labels, 10)).div_(x.size(0));
  // Each layer from the gradient of its output d: weight gradient = d^T input, bias gradient =
  // d's column sums, and its input's gradient d W, through the ReLU before it only where that
  // passed (> 0).
  // Each parameter's gradient, a view into the flat gradient tensor. `.grad()` returns a const
  // reference, and mm_out and sum_out take a non-const one (`Tensor& out`) to write into, so each
  // call first copies the handle into `grad`: the same memory, as `g = p.grad` is in Python.
  torch::Tensor grad;
  torch::mm_out(grad = model->out->weight.grad(), d_out.t(), h2);
  torch::sum_out(grad = model->out->bias.grad(), d_out, /*dim=*/0);
  const torch::Tensor d_h2 = torch::mm(d_out, model->out->weight).mul_(h2 > 0);
  torch::mm_out(grad = model->fc2->weight.grad(), d_h2.t(), h1);
  torch::sum_out(grad = model->fc2->bias.grad(), d_h2, /*dim=*/0);
  const torch::Tensor d_h1 = torch::mm(d_h2, model->fc2->weight).mul_(h1 > 0);
  torch::mm_out(grad = model->fc1->weight.grad(), d_h1.t(), x);  // the images need no gradient
  torch::sum_out(grad = model->fc1->bias.grad(), d_h1, /*dim=*/0);
  trainer.optimizer->step();  // Adam over the flat tensor, as in "flat"
  return loss;
}
//! [manual-step]

// ---- a whole run --------------------------------------------------------------------------------
struct RunResult {
  std::vector<EpochStats> epochs;
  double accuracy = 0;  // on the test set, by course::test_accuracy (lesson 05's torch::max)
};

// A whole run from a seeded model, then its test accuracy. Each run makes its trainer, then its
// batches, which draw their first order: from one seed every run sees the same batches.
RunResult train_and_evaluate(const course::ImageSet& train, const course::ImageSet& test,
                             const std::string& run, int epochs, std::int64_t batch_size,
                             const torch::Device& device, std::uint64_t seed) {
  const std::int64_t samples = train.labels.size(0);
  // Each epoch in turn, as course::run_epochs prints them; Ctrl-C ends the step under way, then
  // the run.
  const auto train_epochs = [&](const std::function<EpochStats()>& epoch) {
    return course::run_epochs(run, epochs, samples, epoch,
                              "nothing is saved (lesson 10 saves and resumes runs)");
  };
  RunResult result;
  if (run == "resident") {  // the tutorial's step: the model, Adam, then the batches
    Trainer trainer = make_trainer(device, seed);
    ResidentBatches batches(train, batch_size, device);
    const auto step = [&](const Batch& batch) { return tutorial_step(trainer, batch); };
    result.epochs = train_epochs([&] {
      trainer.model->train();  // model.train(), as every epoch of lesson 11's
      return run_epoch(batches, device, step);
    });
    result.accuracy = course::test_accuracy(trainer.model, test, device);
  } else if (run == "flat" || run == "manual") {  // flat parameters; manual: backward written out
    FlatTrainer trainer = make_flat_trainer(device, seed);
    ResidentBatches batches(train, batch_size, device);
    std::function<torch::Tensor(const Batch&)> step;  // empty: flat_step
    if (run == "manual") step = [&](const Batch& batch) { return manual_step(trainer, batch); };
    result.epochs = train_epochs([&] { return train_epoch_flat(trainer, batches, device, step); });
    result.accuracy = course::test_accuracy(trainer.model, test, device);
  } else {
    throw course::UsageError("no run '" + run + "'", "use resident, flat or manual");
  }
  return result;
}

// ---- the operators of a step --------------------------------------------------------------------
//! [count]
struct OperatorCounts {
  long long tutorial = 0, flat = 0, manual = 0;  // ATen operators of one step of each form
  std::size_t tensors = 0;                       // the tutorial's Adam's parameter tensors
  double manual_vs_flat = 0;  // the first step's gradients, manual against flat, relative
};

// Each form's step on the same batch from the same weights: the written-out backward's gradients
// against autograd's after the first step (not epoch losses: sums in another order round apart,
// and thousands of steps magnify it), then each step's operators counted on a second step, as
// lessons 19 and 21 count: the first also makes Adam's state, once.
OperatorCounts count_operators_per_step(const course::ImageSet& train, std::int64_t batch_size,
                                        const torch::Device& device, std::uint64_t seed) {
  const Batch batch{train.images.slice(0, 0, batch_size).reshape({-1, kPixels}).to(device),
                    train.labels.slice(0, 0, batch_size).to(device)};
  Trainer tutorial = make_trainer(device, seed);
  FlatTrainer flat = make_flat_trainer(device, seed), manual = make_flat_trainer(device, seed);
  tutorial_step(tutorial, batch);
  flat_step(flat, batch);
  manual_step(manual, batch);
  OperatorCounts counts;
  counts.manual_vs_flat = course::max_rel_diff(manual.flat.gradients, flat.flat.gradients);
  counts.tutorial = course::count_operators([&] { tutorial_step(tutorial, batch); });
  counts.flat = course::count_operators([&] { flat_step(flat, batch); });
  counts.manual = course::count_operators([&] { manual_step(manual, batch); });
  counts.tensors = tutorial.model->parameters().size();
  return counts;
}
//! [count]

// ---- the comparison: each form timed and checked against the form before it --------------------
void compare_runs(const std::vector<std::string>& runs, const course::ImageSet& train,
                  const course::ImageSet& test, int epochs, std::int64_t batch_size, double bar,
                  const torch::Device& device, std::uint64_t seed, course::Verdict& verdict) {
  std::map<std::string, RunResult> results;
  std::vector<course::TimedRun> rows;
  for (const auto& run : runs) {
    results[run] = train_and_evaluate(train, test, run, epochs, batch_size, device, seed);
    rows.push_back({run, course::epoch_timing(results[run].epochs),  // after the first epoch
                    static_cast<double>(train.labels.size(0)), results[run].accuracy});
  }
  course::print_timed_runs(rows, "s/epoch", "samples/s", "test accuracy", device.str());
  // The operators of each form's step, whichever runs were trained: what the lesson measures.
  const OperatorCounts ops = count_operators_per_step(train, batch_size, device, seed);
  std::printf(
      "ATen operators per step: %lld with Adam over %zu parameter tensors, %lld flat, "
      "%lld manual (a step after the first)\n",
      ops.tutorial, ops.tensors, ops.flat, ops.manual);

  verdict.check(ops.flat < ops.tutorial && ops.manual < ops.flat,
                "each form dispatches fewer operators per step than the form before it",
                course::format("%lld, %lld, %lld", ops.tutorial, ops.flat, ops.manual));

  const auto ran = [&](const std::string& run) { return results.count(run) != 0; };
  if (ran("flat") && ran("resident")) {  // the same model, data and batches; Adam's bookkeeping
    const double diff =
        course::max_loss_difference(results["flat"].epochs, results["resident"].epochs);
    verdict.check(
        diff <= kFlatTolerance, "flat trains as resident: one tensor, the same arithmetic",
        course::format("epoch losses within %.2e (tolerance %.0e)", diff, kFlatTolerance));
  }
  if (ran("manual")) {  // one step's gradients, from the same weights on the same batch
    const double tolerance = course::tolerance_for(torch::kFloat);
    verdict.check(ops.manual_vs_flat <= tolerance,
                  "manual trains as flat: backward written out, the same gradients",
                  course::format("a step's gradients within %.2e (tolerance %.0e)",
                                 ops.manual_vs_flat, tolerance));
  }
  for (const auto& run : runs) {
    verdict.check(results[run].accuracy >= bar, run + " run: test accuracy reaches the bar",
                  course::format("%.4f vs bar %.2f", results[run].accuracy, bar));
  }
}

}  // namespace lesson12

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson12.cpp and bench_training include this file
int main(int argc, char** argv) try {
  using namespace lesson12;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  int batch_size = static_cast<int>(kBatchSize);
  std::string only = "all";
  course::Cli cli("lesson12_fewer_operators",
                  "Lesson 12: the training step in fewer operators, one change at a time.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_option("--run", only, "which run to train (all: each in turn)",
                 {"all", "resident", "flat", "manual"});
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  // kAccuracyBar is for a full run (all images, >= kEpochs, batches <= kBatchSize).
  const bool full_run = !options.quick && epochs >= kEpochs && batch_size <= kBatchSize;
  std::cout << "Fashion-MNIST: " << train.labels.size(0) << " training images, "
            << test.labels.size(0) << " test; the tutorial's ANN, batch " << batch_size << ", "
            << epochs << " epoch(s)\n";
  std::vector<std::string> runs = {only};
  if (only == "all") runs = {"resident", "flat", "manual"};
  compare_runs(runs, train, test, epochs, batch_size, full_run ? kAccuracyBar : kQuickAccuracyBar,
               device, options.seed, verdict);
  return verdict.finish("lesson 12 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
