// Lesson 21 (going further) — the fastest epoch: the tutorial's training (lesson 05's ANN, batch
// 64, Adam at 1e-3, a new shuffle each epoch, 5 epochs) with the fewest operators per step and
// no host in the loop. A step of this model is small (29 MFLOP per batch of 64); what costs is
// its operators: on a GPU each is a kernel the host launches and the GPU finishes in microseconds,
// on a CPU each pays microseconds of dispatch. The way to the floor is fewer operators.
//
// You will learn, form by form (--run NAME), each checked against the form before it:
//   - "tutorial": lesson 05's loop (common/ann.h): LibTorch's DataLoader, each batch moved with
//     .to(device), autograd, Adam over six parameter tensors, loss.item() every step;
//   - "resident": the same step; the dataset on the device, shuffled there once per epoch (each
//     batch then a slice: no gather, no copy), each step's loss kept on the device;
//   - "fused": lesson 12's "manual" form (one flat parameter tensor, the backward pass written out
//     into the gradients' own memory) in fewer operators: linear + ReLU as one, the loss's
//     gradient in two, results written into memory made once, LibTorch's fused Adam;
//   - "graphed": on CUDA, the fused epoch as one CUDA graph, replayed: one launch per epoch.
//
// Run:    build/bin/lesson21_fastest_epoch [--device ...] [--epochs N] [--quick] [--data-dir DIR]
//           [--run all|tutorial|resident|fused|graphed]
// Checks: fused's steps equal the tutorial's, graphed's fused's (CUDA), within kStepTolerance; on
//         the CPU resident's epochs equal the tutorial's; each test accuracy >= kAccuracyBar (or
//         kQuickAccuracyBar). Exit 0 PASS, 1 FAIL, 2 bad flag or missing data, 130 Ctrl-C.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, at::_addmm_activation_out, ...

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>

#include "common/ann.h"              // defines: ANN, lesson 05's loader and epoch, test_accuracy
#include "common/cli.h"              // defines: Cli, start_lesson
#include "common/compare.h"          // defines: tolerance_for
#include "common/data.h"             // defines: ImageSet, load_fashion_mnist_splits
#include "common/device.h"           // defines: synchronize
#include "common/flat_parameters.h"  // defines: flatten_parameters (lesson 12's)
#include "common/interrupt.h"        // defines: stop_requested (Ctrl-C)
#include "common/report.h"           // defines: EpochStats, run_epochs, print_timed_runs, format
#include "common/timing.h"           // defines: Stopwatch, count_operators
#include "common/verdict.h"          // defines: Verdict, report_error
#include "device_shuffle.h"          // defines: EpochData, DeviceShuffler (the batches)
#include "flat_trainer.h"            // defines: FlatTrainer, StepBuffers (the fused step's state)
#include "floors.h"                  // defines: print_floors (part 3)
#include "graphed_epoch.h"           // defines: GraphedEpoch (the "graphed" form)

namespace lesson21 {

// ---- knobs --------------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 5;       // lesson 05's: the first weights and the batches' order
constexpr int kEpochs = 5;               // the tutorial's: for epoch in range(5)
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr int kWorkers = 2;              // lesson 05's loader threads (num_workers=2)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;  // Adam's defaults
constexpr double kAccuracyBar = 0.85;  // test accuracy after kEpochs on all 60,000 images
// --quick: one epoch on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
constexpr int kCheckSteps = 100, kQuickCheckSteps = 20;  // batches each form is checked on
// Two forms round a last bit otherwise (another kernel, another order of a sum), and training
// carries such bits on from step to step: ten times fp32's (common/compare.h), relative.
constexpr double kStepTolerance = 10 * course::tolerance_for(torch::kFloat);
// The course's goal for the graphed epoch (printed, never checked): about 1 us for each kernel of
// the epoch's 938 steps, set before any GPU ran the lesson; an H200's run is on the page.
constexpr double kGoalEpochMs = 25;
//! [knobs]

using course::ANN;  // the tutorial's ANN (fc1, fc2, out): one seed, lesson 05's weights

// ---- 1. "tutorial" and "resident": lesson 05's step ---------------------------------------------
//! [tutorial-step]
struct Trainer {  // model = ANN().to(device); optimizer = optim.Adam(model.parameters(), lr=1e-3)
  ANN model;
  std::unique_ptr<torch::optim::Adam> optimizer;
};

Trainer make_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // every form starts from the same weights
  Trainer trainer;
  trainer.model->to(device);
  trainer.optimizer = std::make_unique<torch::optim::Adam>(
      trainer.model->parameters(), torch::optim::AdamOptions(kLearningRate));
  return trainer;
}

// The tutorial's step on a batch already on the device. Its loss goes into `loss_out`, a slot of
// the epoch's losses on the device: no .item(), no wait.
void tutorial_step(Trainer& trainer, const torch::Tensor& images, const torch::Tensor& labels,
                   torch::Tensor loss_out) {
  trainer.model->train();
  const torch::Tensor loss =
      torch::nn::functional::cross_entropy(trainer.model->forward(images), labels);
  trainer.optimizer->zero_grad();
  loss.backward();
  trainer.optimizer->step();
  loss_out.copy_(loss.detach());
}
//! [tutorial-step]

// ---- 2. "fused": the backward pass written out, in the fewest operators -------------------------
// Its state (FlatTrainer, StepBuffers, has_fused_adam, buffers_for): flat_trainer.h, beside this.
//! [make-flat-trainer]
FlatTrainer make_flat_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the tutorial's first weights
  FlatTrainer t;
  t.model->to(device);
  t.flat = course::flatten_parameters(*t.model);  // each parameter a view into one tensor
  t.fc1_t = t.model->fc1->weight.t(), t.fc2_t = t.model->fc2->weight.t();
  t.out_t = t.model->out->weight.t();
  t.optimizer = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{t.flat.values},
                                                     torch::optim::AdamOptions(kLearningRate));
  t.exp_avg = torch::zeros_like(t.flat.values);
  t.exp_avg_sq = torch::zeros_like(t.flat.values);
  t.step = torch::zeros({}, t.flat.values.options());  // float32, as Python's fused Adam
  return t;
}
//! [make-flat-trainer]

// The step below, in Python (W1, b1 ... the ANN's parameters; B the batch's rows; y the labels):
//   with torch.no_grad():
//       h1 = torch.relu(x @ W1.T + b1);  h2 = torch.relu(h1 @ W2.T + b2)
//       log_probs = F.log_softmax(h2 @ W3.T + b3, 1);  loss = F.nll_loss(log_probs, y)
//       d = log_probs.exp() - F.one_hot(y, 10)       # cross entropy's gradient, times B
//       W3.grad = d.T @ h2 / B;  b3.grad = d.sum(0) / B
//       d_h2 = (d @ W3 / B) * (h2 > 0);  W2.grad = d_h2.T @ h1;  b2.grad = d_h2.sum(0)
//       d_h1 = (d_h2 @ W2) * (h1 > 0);   W1.grad = d_h1.T @ x;   b1.grad = d_h1.sum(0)
//   optimizer.step()                                  # Adam, fused, over the one flat tensor
//! [fused-step]
void fused_step(FlatTrainer& trainer, const torch::Tensor& x, const torch::Tensor& labels,
                torch::Tensor loss_out) {
  torch::NoGradGuard no_grad;
  ANN& model = trainer.model;
  const std::int64_t rows = x.size(0);
  StepBuffers& b = buffers_for(trainer, rows);
  // Each call below names its arguments as ATen declares them (/*name=*/), but for the first, the
  // `out` an _out operator writes into. In Python: torch.addmm(self, mat1, mat2, out=out).
  // >>> lab: the forward pass: each Linear + ReLU as one operator, into b.h1 and b.h2
  at::_addmm_activation_out(b.h1, /*self=*/model->fc1->bias, /*mat1=*/x, /*mat2=*/trainer.fc1_t);
  at::_addmm_activation_out(b.h2, /*self=*/model->fc2->bias, /*mat1=*/b.h1,
                            /*mat2=*/trainer.fc2_t);  // h2 = relu(h1 W2^T + b2)
  // <<< lab
  torch::addmm_out(b.logits, /*self=*/model->out->bias, /*mat1=*/b.h2, /*mat2=*/trainer.out_t);
  at::_log_softmax_out(b.log_probs, /*self=*/b.logits, /*dim=*/1, /*half_to_float=*/false);
  at::nll_loss_forward_out(loss_out, /*total_weight=*/b.total_weight, /*self=*/b.log_probs,
                           /*target=*/labels, /*weight=*/{}, /*reduction=*/at::Reduction::Mean,
                           /*ignore_index=*/-100);  // F.nll_loss: with log_softmax, cross_entropy
  // Backward written out (loss.backward()'s work): for y = h W^T + b and d = dL/dy, dW = d^T h,
  // db = d's rows summed, dh = d W; ReLU passes d where its output > 0. The loss's d, times B (the
  // 1/B rides on the products' alpha), is softmax - one_hot(labels), in two operators:
  // >>> lab: b.d_out = softmax - one_hot(labels), in two operators (exp_out, scatter_add_)
  at::exp_out(b.d_out, /*self=*/b.log_probs);
  b.d_out.scatter_add_(/*dim=*/1, /*index=*/labels.view({-1, 1}), /*src=*/b.minus_ones);
  // <<< lab
  const double inv_rows = 1.0 / static_cast<double>(rows);
  // Each parameter's gradient, a view into the one flat gradient tensor: the products write into
  // them (an _out operator needs a tensor it may write, which .grad() alone does not give).
  torch::Tensor d_w3 = model->out->weight.grad(), d_b3 = model->out->bias.grad();
  torch::Tensor d_w2 = model->fc2->weight.grad(), d_b2 = model->fc2->bias.grad();
  torch::Tensor d_w1 = model->fc1->weight.grad(), d_b1 = model->fc1->bias.grad();
  // out = beta * self + alpha * (mat1 @ mat2); beta 0 ignores self, alpha is the 1/B.
  at::addmm_out(d_w3, /*self=*/d_w3, /*mat1=*/b.d_out_t, /*mat2=*/b.h2, /*beta=*/0,
                /*alpha=*/inv_rows);  // dL/dW3 = d^T h2 / B
  at::addmv_out(d_b3, /*self=*/d_b3, /*mat=*/b.d_out_t, /*vec=*/b.ones, /*beta=*/0,
                /*alpha=*/inv_rows);  // dL/db3 = d's rows summed / B
  at::addmm_out(b.d_h2, /*self=*/b.d_h2, /*mat1=*/b.d_out, /*mat2=*/model->out->weight,
                /*beta=*/0, /*alpha=*/inv_rows);  // dL/dh2 = d W3 / B
  at::threshold_backward_out(b.d_h2, /*grad_output=*/b.d_h2, /*self=*/b.h2, /*threshold=*/0);
  torch::mm_out(d_w2, /*self=*/b.d_h2_t, /*mat2=*/b.h1);                // dL/dW2 = d_h2^T h1
  torch::sum_out(d_b2, /*self=*/b.d_h2, /*dim=*/0);                     // dL/db2
  torch::mm_out(b.d_h1, /*self=*/b.d_h2, /*mat2=*/model->fc2->weight);  // dL/dh1 = d_h2 W2
  at::threshold_backward_out(b.d_h1, /*grad_output=*/b.d_h1, /*self=*/b.h1, /*threshold=*/0);
  torch::mm_out(d_w1, /*self=*/b.d_h1_t, /*mat2=*/x);  // dL/dW1 = d_h1^T x (x: no gradient)
  torch::sum_out(d_b1, /*self=*/b.d_h1, /*dim=*/0);    // dL/db1
  if (!has_fused_adam(x.device())) {
    trainer.optimizer->step();  // LibTorch's Adam over the one flat tensor
    return;
  }
  // >>> lab: Adam in one operator: count the step on the device, then at::_fused_adam_
  trainer.step.add_(1);  // the step count on the device: a graph replays this, not a host number
  // Every argument a list of tensors, one per parameter tensor (here the one flat tensor):
  at::_fused_adam_(/*self (the parameters)=*/{trainer.flat.values},
                   /*grads=*/{trainer.flat.gradients}, /*exp_avgs=*/{trainer.exp_avg},
                   /*exp_avg_sqs=*/{trainer.exp_avg_sq}, /*max_exp_avg_sqs=*/{},
                   /*state_steps=*/{trainer.step}, /*lr=*/kLearningRate, /*beta1=*/kBeta1,
                   /*beta2=*/kBeta2, /*weight_decay=*/0, /*eps=*/kEpsilon, /*amsgrad=*/false,
                   /*maximize=*/false);
  // <<< lab
}
//! [fused-step]

// ---- 3. "graphed": the fused epoch in one CUDA graph --------------------------------------------
// The fused step for every batch of an epoch, in one CUDA graph: GraphedEpoch, graphed_epoch.h.

// ---- an epoch of each form ----------------------------------------------------------------------
//! [resident-epoch]
// EpochStats: an epoch's mean loss, its seconds, the samples it saw and whether Ctrl-C stopped it.
using course::EpochStats;
// A step on one batch: its images, its labels, and the slot its loss goes into.
using Step = std::function<void(const torch::Tensor&, const torch::Tensor&, torch::Tensor)>;

// One epoch of a resident form: the shuffle on the device, `step` on each batch (its loss into its
// slot), then the losses read once: the one wait for the GPU, per epoch.
EpochStats resident_epoch(DeviceShuffler& shuffler, EpochData& epoch, const torch::Device& device,
                          const Step& step) {
  course::Stopwatch watch(device);
  shuffler.shuffle(epoch);
  std::int64_t steps = 0, seen = 0;
  while (steps < epoch.steps()) {
    step(epoch.batch_images[steps], epoch.batch_labels[steps], epoch.loss_slots[steps]);
    seen += epoch.batch_labels[steps++].size(0);
    if (course::stop_requested()) break;  // Ctrl-C: the step is whole; stop here
  }
  const double total_loss = epoch.losses.narrow(0, 0, steps).sum(torch::kDouble).item<double>();
  return {total_loss / static_cast<double>(steps), watch.seconds(), seen, steps < epoch.steps()};
}

// The graphed epoch: the shuffle, one replay (the capture in the first epoch, after its shuffle).
EpochStats graphed_epoch(DeviceShuffler& shuffler, EpochData& epoch, FlatTrainer& trainer,
                         std::optional<GraphedEpoch>& graph, const torch::Device& device) {
  course::Stopwatch watch(device);
  shuffler.shuffle(epoch);
  if (!graph) graph.emplace(trainer, epoch, fused_step);
  graph->replay();
  const double total_loss = epoch.losses.sum(torch::kDouble).item<double>();
  // Ctrl-C: the replay is the whole epoch, so the run stops after it.
  return {total_loss / static_cast<double>(epoch.steps()), watch.seconds(), epoch.images.size(0),
          course::stop_requested()};
}
//! [resident-epoch]

// ---- a whole run --------------------------------------------------------------------------------
struct RunResult {
  std::vector<EpochStats> epochs;
  double accuracy = 0;  // on the test set, by course::test_accuracy (lesson 05's torch::max)
};

// Form `run` trained for `epochs` from the seed, then its test accuracy. Each run makes its
// trainer, then its loader or shuffler, which draws its first order: on the CPU, from one seed,
// every form sees the same batches.
RunResult train_and_evaluate(const course::ImageSet& train, const course::ImageSet& test,
                             const std::string& run, int epochs, const torch::Device& device,
                             std::uint64_t seed) {
  const std::int64_t samples = train.labels.size(0);
  const auto train_epochs = [&](const std::function<EpochStats()>& epoch) {
    return course::run_epochs(run, epochs, samples, epoch, "nothing is saved");
  };
  RunResult result;
  if (run == "tutorial" || run == "resident") {  // the model, Adam, then the loader
    Trainer trainer = make_trainer(device, seed);
    if (run == "tutorial") {  // lesson 05's program: LibTorch's DataLoader and its workers
      auto loader = course::make_train_loader(course::FashionMNIST(train), kBatchSize, kWorkers);
      result.epochs = train_epochs([&]() -> EpochStats {
        course::Stopwatch watch(device);
        const auto [steps, loss] =
            course::train_epoch(trainer.model, *trainer.optimizer, *loader, device);
        return {loss, watch.seconds(), samples, false};
      });
    } else {
      DeviceShuffler shuffler(train, device);
      EpochData epoch(samples, kBatchSize, device);
      const Step step = [&](auto& x, auto& y, auto loss) { tutorial_step(trainer, x, y, loss); };
      result.epochs = train_epochs([&] { return resident_epoch(shuffler, epoch, device, step); });
    }
    result.accuracy = course::test_accuracy(trainer.model, test, device);
    return result;
  }
  if (run != "fused" && run != "graphed")
    throw course::UsageError("no form '" + run + "'", "use tutorial, resident, fused or graphed");
  FlatTrainer trainer = make_flat_trainer(device, seed);
  DeviceShuffler shuffler(train, device);
  EpochData epoch(samples, kBatchSize, device);
  std::optional<GraphedEpoch> graph;
  const Step step = [&](auto& x, auto& y, auto loss) { fused_step(trainer, x, y, loss); };
  result.epochs = train_epochs([&] {
    return run == "graphed" ? graphed_epoch(shuffler, epoch, trainer, graph, device)
                            : resident_epoch(shuffler, epoch, device, step);
  });
  result.accuracy = course::test_accuracy(trainer.model, test, device);
  return result;
}

// ---- the checks: each form against the form before it, on the same batches ----------------------
//! [check-forms]
// Every form trains `steps` steps from the seed on the same batches (one shuffle, on the device);
// returns each form's losses, step by step (the graphed form's only on CUDA), and `*kernels` the
// graph's kernels per step (0 where this LibTorch cannot count them: before 2.8).
std::map<std::string, torch::Tensor> losses_on_same_batches(const course::ImageSet& train,
                                                            int steps, const torch::Device& device,
                                                            std::uint64_t seed,
                                                            double* kernels = nullptr) {
  DeviceShuffler shuffler(train, device);
  EpochData batches(steps * kBatchSize, kBatchSize, device);
  shuffler.shuffle(batches);
  std::map<std::string, torch::Tensor> losses;
  const auto train_steps = [&](const Step& step) {
    for (std::int64_t k = 0; k < batches.steps(); ++k)
      step(batches.batch_images[k], batches.batch_labels[k], batches.loss_slots[k]);
    return batches.losses.clone();
  };
  Trainer tutorial = make_trainer(device, seed);
  losses["tutorial"] =
      train_steps([&](auto& x, auto& y, auto l) { tutorial_step(tutorial, x, y, l); });
  FlatTrainer fused = make_flat_trainer(device, seed);
  losses["fused"] = train_steps([&](auto& x, auto& y, auto l) { fused_step(fused, x, y, l); });
  if (device.is_cuda()) {
    FlatTrainer graphed = make_flat_trainer(device, seed);
    GraphedEpoch graph(graphed, batches, fused_step);
    graph.replay();  // all the steps: one replay
    losses["graphed"] = batches.losses.clone();
    if (kernels != nullptr) *kernels = static_cast<double>(graph.kernels()) / steps;
    course::synchronize(device);  // the graph's memory is its own: keep it until its work is done
  }
  return losses;
}

// The largest relative difference between two forms' losses, step by step.
double relative_difference(const torch::Tensor& got, const torch::Tensor& expected) {
  return ((got - expected).abs() / expected.abs()).max().item<double>();
}
//! [check-forms]

// ---- the lesson ---------------------------------------------------------------------------------
// ATen operators one step of `run` dispatches, counted on a second step of a fresh trainer (the
// first makes the fused step's buffers). course::count_operators counts nested operators and
// views too.
long long operators_per_step(const std::string& run, const course::ImageSet& train,
                             const torch::Device& device, std::uint64_t seed) {
  const torch::Tensor x = train.images.slice(0, 0, kBatchSize).reshape({-1, kPixels}).to(device);
  const torch::Tensor y = train.labels.slice(0, 0, kBatchSize).to(device);
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(device));
  Trainer tutorial = make_trainer(device, seed);
  FlatTrainer fused = make_flat_trainer(device, seed);
  const bool autograd = run == "tutorial" || run == "resident";  // "graphed": the fused step's
  const auto step = [&] {
    autograd ? tutorial_step(tutorial, x, y, loss) : fused_step(fused, x, y, loss);
  };
  step();
  return course::count_operators(step);
}

void run_lesson(const std::vector<std::string>& runs, const course::ImageSet& train,
                const course::ImageSet& test, int epochs, int check_steps, double bar,
                const torch::Device& device, std::uint64_t seed, course::Verdict& verdict) {
  std::printf("\n1. each form against the one before, %d steps on the same batches\n  Adam: %s\n",
              check_steps,
              has_fused_adam(device) ? "LibTorch's fused kernel (at::_fused_adam_)"
                                     : "LibTorch's, over one tensor (no fused Adam)");
  double kernels = 0;  // per step, in the graph (CUDA)
  const auto losses = losses_on_same_batches(train, check_steps, device, seed, &kernels);
  for (const auto& [form, before] : std::vector<std::pair<std::string, std::string>>{
           {"fused", "tutorial"}, {"graphed", "fused"}}) {
    if (losses.count(form) == 0) {
      std::printf("  %s: (skipped: needs CUDA)\n", form.c_str());
      continue;
    }
    const double diff = relative_difference(losses.at(form), losses.at(before));
    verdict.check(diff <= kStepTolerance, form + " trains as " + before,
                  course::format("largest relative loss difference %.2e over %d steps (tolerance"
                                 " %.0e)",
                                 diff, check_steps, kStepTolerance));
  }

  std::printf("\n2. each form trained, %d epoch(s)\n", epochs);
  std::map<std::string, RunResult> results;
  std::vector<course::TimedRun> rows;
  for (const auto& run : runs) {
    if (run == "graphed" && !device.is_cuda()) {
      std::printf("  graphed: (skipped: needs CUDA)\n");
      continue;
    }
    results[run] = train_and_evaluate(train, test, run, epochs, device, seed);
    rows.push_back({run, course::epoch_timing(results[run].epochs),  // after the first epoch
                    static_cast<double>(train.labels.size(0)), results[run].accuracy});
  }
  course::print_timed_runs(rows, "ms/epoch", "samples/s", "test accuracy", device.str());

  // What bounds each form: its operators per step, and the time each costs (floors.h).
  print_floors(
      rows, [&](const std::string& run) { return operators_per_step(run, train, device, seed); },
      train.labels.size(0), kBatchSize, kernels, kGoalEpochMs, device);

  if (results.count("resident") && results.count("tutorial") && device.is_cpu()) {
    const double diff =  // a GPU draws its orders with its own generator: other batches
        course::max_loss_difference(results["resident"].epochs, results["tutorial"].epochs);
    verdict.check(
        diff <= kStepTolerance, "resident trains as tutorial: the same batches",
        course::format("epoch losses within %.2e (tolerance %.0e)", diff, kStepTolerance));
  }
  for (const auto& [run, result] : results) {
    verdict.check(result.accuracy >= bar, run + " run: test accuracy reaches the bar",
                  course::format("%.4f vs bar %.2f", result.accuracy, bar));
  }
}

}  // namespace lesson21

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson21.cpp includes this file
int main(int argc, char** argv) try {
  using namespace lesson21;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  std::string only = "all";
  course::Cli cli("lesson21_fastest_epoch",
                  "Lesson 21: the tutorial's training with the fewest operators per step.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--run", only, "which form to train (all: each in turn)",
                 {"all", "tutorial", "resident", "fused", "graphed"});
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  const bool full_run = !options.quick && epochs >= kEpochs;  // kAccuracyBar is for a full run
  std::cout << "Fashion-MNIST: " << train.labels.size(0) << " training images, "
            << test.labels.size(0) << " test; the tutorial's ANN\n";
  std::vector<std::string> runs = {only};
  if (only == "all") runs = {"tutorial", "resident", "fused", "graphed"};
  run_lesson(runs, train, test, epochs, options.quick ? kQuickCheckSteps : kCheckSteps,
             full_run ? kAccuracyBar : kQuickAccuracyBar, device, options.seed, verdict);
  return verdict.finish("lesson 21 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
