// Lesson 06 — evaluation without a graph: eval(), NoGradGuard and InferenceMode.
//
// You will learn:
//   - the tutorial's evaluation loop, line for line: model->eval(), a NoGradGuard for
//     `with torch.no_grad():`, each batch moved, torch::max(outputs, 1), the test accuracy;
//   - model->eval() changes what layers DO (dropout stops dropping, batch norm uses its running
//     statistics); it does not stop autograd;
//   - torch::NoGradGuard stops autograd from recording: outputs have no grad_fn, intermediate
//     activations are freed as soon as they are used, so peak memory drops (the time, measured,
//     moves less than the noise here);
//   - c10::InferenceMode goes further (no version counters or view tracking), but its outputs
//     are "inference tensors" that can never be saved for backward;
//   - what each costs, measured: peak memory (CUDA allocator statistics, or the counting CPU
//     allocator) and time.
//
// Run:    build/bin/lesson06_no_grad_eval [--device ...] [--data-dir DIR] [--quick]
// Checks: the tutorial's loop records no graph; outputs under no_grad and inference mode carry
//         no graph; the inference tensor is refused by autograd; the no-grad peak memory is below
//         the with-grad peak; in train mode dropout makes outputs differ, in eval mode they are
//         identical. Exit 0 PASS, 1 FAIL, 2 bad flag or missing data.
#include <torch/torch.h>  // defines: torch::NoGradGuard, c10::InferenceMode, torch::nn, torch::data

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/data.h"     // defines: ImageSet, find_fashion_mnist, load_fashion_mnist
#include "common/dataset.h"  // defines: FashionMNIST (torchvision's datasets.FashionMNIST)
#include "common/device.h"   // defines: format_bytes
#include "common/timing.h"   // defines: Timing, time_median, describe_ms, timing_note
#include "common/verdict.h"  // defines: Verdict, error_message, report_error
#include "memory/memory.h"   // defines: memory_stats, reset_peak_memory (lesson 07 shows the API)

namespace lesson06 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 6;
constexpr std::int64_t kBatchSize = 64;       // the tutorial's DataLoader(test_ds, batch_size=64)
constexpr double kDropout = 0.2;              // probability of zeroing an activation in training
constexpr std::int64_t kQuickSamples = 2000;  // --quick evaluates this many test images
constexpr std::int64_t kEvalBatch = 500;      // images per forward pass of the measured passes
constexpr int kTimedRuns = 7;                 // median of this many passes, after 2 warm-ups

// ---- 1. The tutorial's evaluation ---------------------------------------------------------------
/// Lesson 05's ANN (the tutorial's: fc1, fc2, out), with dropout after each hidden layer.
struct ANNImpl : torch::nn::Module {
  ANNImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        out(register_module("out", torch::nn::Linear(64, 10))),
        drop(register_module("drop", torch::nn::Dropout(kDropout))) {}

  //! [forward]
  torch::Tensor forward(const torch::Tensor& x) {
    // One statement per layer, not out(drop(relu(fc2(...)))): C++ keeps every temporary of an
    // expression alive until the end of the statement, so a nested call would hold all the
    // activations at once even when nothing needs them any more.
    torch::Tensor h = x.view({x.size(0), -1});  // [B, 1, 28, 28] -> [B, 784]
    h = torch::relu(fc1(h));
    h = drop(h);
    h = torch::relu(fc2(h));
    h = drop(h);
    return out(h);
  }
  //! [forward]

  torch::nn::Linear fc1, fc2, out;
  torch::nn::Dropout drop;
};
TORCH_MODULE(ANN);

// DataLoader(test_ds, batch_size=64), as lesson 05 builds it: the samples in order, on the host.
using TestLoader = torch::data::StatelessDataLoader<
    torch::data::datasets::MapDataset<course::FashionMNIST, torch::data::transforms::Stack<>>,
    torch::data::samplers::SequentialSampler>;
std::unique_ptr<TestLoader> make_test_loader(course::FashionMNIST test_ds) {
  return torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(test_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(kBatchSize));
}

/// What the tutorial's loop found.
struct Evaluation {
  double accuracy = 0;
  bool recorded_graph = false;  ///< some batch's outputs asked for gradients (a graph was built)
};

//! [tutorial]
Evaluation tutorial_evaluate(ANN& model, TestLoader& test_loader, const torch::Device& device) {
  Evaluation result;
  model->eval();
  std::int64_t correct = 0;
  std::int64_t total = 0;
  {  // with torch.no_grad(): the guard records nothing until the end of this block
    // >>> lab: turn gradient recording off for the evaluation, as `with torch.no_grad():` does
    torch::NoGradGuard no_grad;
    // <<< lab
    for (auto& [features, labels] : test_loader) {
      features = features.to(device);
      labels = labels.to(device);

      torch::Tensor outputs = model->forward(features);
      auto [values, predicted] = torch::max(outputs, /*dim=*/1);  // _, predicted = ...

      correct += (predicted == labels).sum().item<std::int64_t>();
      total += labels.size(0);
      result.recorded_graph |= outputs.requires_grad();  // the lesson's check, not the tutorial's
    }
  }
  result.accuracy = static_cast<double>(correct) / static_cast<double>(total);
  std::printf("Test Accuracy: %.4f\n", result.accuracy);
  return result;
}
//! [tutorial]

// ---- 2. Three ways to run the same pass, measured ----------------------------------------------
/// How an evaluation pass is run. (`enum class`: a type of its own, whose values are written
/// Mode::kGrad and so on.)
enum class Mode { kGrad, kNoGrad, kInference };

/// Evaluates `images` batch by batch under `mode` and returns the logits of all of them, as an
/// evaluation loop that collects predictions does (the model's train/eval state is left as is).
//! [modes]
torch::Tensor evaluate_in_mode(ANN& model, const torch::Tensor& images, Mode mode) {
  //! [optional-guards]
  std::optional<torch::NoGradGuard> no_grad;    // records nothing while it lives
  std::optional<c10::InferenceMode> inference;  // no_grad, and no version counters either
  // >>> lab: switch on the guard that `mode` asks for (no_grad or inference)
  if (mode == Mode::kNoGrad) no_grad.emplace();
  if (mode == Mode::kInference) inference.emplace();
  // <<< lab
  //! [optional-guards]
  std::vector<torch::Tensor> logits;
  for (std::int64_t start = 0; start < images.size(0); start += kEvalBatch) {
    // With grad, each batch's logits hold its graph, and the graph holds every activation that
    // backward would need: keeping the logits keeps all of them, batch after batch.
    logits.push_back(model->forward(images.slice(0, start, start + kEvalBatch)));
  }
  return torch::cat(logits);
}
//! [modes]

/// What an evaluation pass produced and cost.
struct PassFacts {
  bool requires_grad = false;   ///< the output asks for gradients
  bool has_grad_fn = false;     ///< the output is the head of a recorded graph
  bool is_inference = false;    ///< the output is an inference tensor
  std::int64_t peak_bytes = 0;  ///< peak memory above the starting point, during the pass
  std::int64_t kept_bytes = 0;  ///< memory still held after it, while its logits are alive
  course::Timing time;          ///< time of a pass: median, fastest and slowest of the runs
};

/// Runs the pass in eval mode after one warm-up batch, measuring peak memory with the course's
/// meter (memory/memory.h: on the CPU, a counting allocator, installed by its first read) and
/// time: the figures are what a pass allocates above what was live before it.
PassFacts measure_pass(ANN& model, const torch::Tensor& x, Mode mode, const torch::Device& device,
                       int timed_runs = kTimedRuns) {
  model->eval();
  PassFacts facts;
  // Warm up first: the first matmul on a CUDA device creates cuBLAS's handle and its workspace,
  // which would be charged to whichever mode is measured first.
  evaluate_in_mode(model, x.slice(0, 0, kEvalBatch), mode);
  {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());  // torch.cuda.synchronize()
    course::reset_peak_memory(device);
    const std::int64_t start = course::memory_stats(device).allocated;
    const torch::Tensor logits = evaluate_in_mode(model, x, mode);
    if (device.is_cuda()) torch::cuda::synchronize(device.index());  // the pass has finished
    const course::MemoryStats after = course::memory_stats(device);
    facts.peak_bytes = after.peak_allocated - start;
    facts.kept_bytes = after.allocated - start;
    facts.requires_grad = logits.requires_grad();
    facts.has_grad_fn = logits.grad_fn() != nullptr;
    facts.is_inference = logits.is_inference();
  }
  facts.time = course::time_median([&] { evaluate_in_mode(model, x, mode); }, device,
                                   /*warmup=*/2, timed_runs);
  return facts;
}

/// Feeds an inference-mode output back into autograd and returns LibTorch's error message
/// (empty if, against the rules, no error was raised).
//! [inference-error]
std::string inference_tensor_error(ANN& model, const torch::Tensor& x) {
  torch::Tensor logits;
  {
    c10::InferenceMode inference;
    logits = model->forward(x);
  }
  try {
    // Scaling by a trainable weight saves `logits` for backward: not allowed for inference
    // tensors. Use NoGradGuard (or logits.clone() outside inference mode) for such outputs.
    const torch::Tensor loss = (logits * model->out->bias.sum()).sum();
    loss.backward();
  } catch (const c10::Error& error) {
    return course::error_message(error);
  }
  return "";
}
//! [inference-error]

/// Two forward passes of the same input: are the outputs identical?
//! [dropout]
bool repeat_is_identical(ANN& model, const torch::Tensor& x, bool train_mode) {
  if (train_mode) {
    model->train();  // dropout zeroes a random 20% of activations (and scales the rest)
  } else {
    model->eval();  // dropout passes everything through
  }
  torch::NoGradGuard no_grad;
  return torch::equal(model->forward(x), model->forward(x));
}
//! [dropout]

// ---- the program's steps (main, below, runs them in order) --------------------------------------
/// The three passes' facts, one for each Mode.
struct ModeFacts {
  PassFacts grad, no_grad, inference;
};

// One row of the table: what a pass in mode `name` produced and cost.
void print_row(const char* name, const PassFacts& f) {
  std::printf("%-15s %-14s %-8s %-10s %-12s %-11s %s\n", name, f.requires_grad ? "true" : "false",
              f.has_grad_fn ? "yes" : "none", f.is_inference ? "yes" : "no",
              course::format_bytes(static_cast<double>(f.peak_bytes)).c_str(),
              course::format_bytes(static_cast<double>(f.kept_bytes)).c_str(),
              course::describe_ms(f.time).c_str());
}

// measure_pass() in each mode, with one row of the table printed for each.
ModeFacts measure_modes(ANN& model, const torch::Tensor& x, const torch::Device& device) {
  std::cout << "mode            requires_grad  grad_fn  inference  peak memory  held after  "
               "time: median (fastest-slowest)\n";
  ModeFacts m;
  m.grad = measure_pass(model, x, Mode::kGrad, device);
  print_row("with grad", m.grad);
  m.no_grad = measure_pass(model, x, Mode::kNoGrad, device);
  print_row("NoGradGuard", m.no_grad);
  m.inference = measure_pass(model, x, Mode::kInference, device);
  print_row("InferenceMode", m.inference);
  std::cout << course::timing_note({m.grad.time, m.no_grad.time, m.inference.time});
  return m;
}

// "<no-grad peak> vs <with-grad peak>, <ratio>x less": the evidence of the memory check.
std::string peak_ratio(const PassFacts& no_grad, const PassFacts& grad) {
  char ratio[80];
  std::snprintf(
      ratio, sizeof ratio, "%s vs %s, %.1fx less",
      course::format_bytes(static_cast<double>(no_grad.peak_bytes)).c_str(),
      course::format_bytes(static_cast<double>(grad.peak_bytes)).c_str(),
      static_cast<double>(grad.peak_bytes) / std::max<std::int64_t>(no_grad.peak_bytes, 1));
  return ratio;
}

}  // namespace lesson06

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson06.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson06;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("lesson06_no_grad_eval",
                  "Lesson 06: eval(), NoGradGuard and InferenceMode, measured.", options);
  cli.add_data_dir();
  if (auto code = cli.parse(argc, argv)) return *code;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);  // tutorials'
  device = course::start_lesson(options, device);  // --device may override it; printed first
  course::Verdict verdict;

  course::ImageSet test =
      course::load_fashion_mnist(course::find_fashion_mnist(options.data_dir), false);
  const std::int64_t n = options.quick ? kQuickSamples : test.labels.size(0);
  torch::manual_seed(options.seed);
  ANN model;
  model->to(device);

  std::cout << "The tutorial's evaluation (tutorial 000, part 5) of an untrained ANN, " << n
            << " test images on " << device << ":\n";
  auto test_loader = make_test_loader(course::FashionMNIST(
      course::ImageSet{test.images.slice(0, 0, n), test.labels.slice(0, 0, n)}));
  const Evaluation evaluation = tutorial_evaluate(model, *test_loader, device);
  verdict.check(!evaluation.recorded_graph,
                "the tutorial's loop, under NoGradGuard, records no graph");

  const torch::Tensor x = test.images.slice(0, 0, n).reshape({n, 28 * 28}).to(device);
  std::cout << "\nThe same images in batches of " << kEvalBatch
            << ", three ways, keeping the logits:\n";
  const ModeFacts facts = measure_modes(model, x, device);
  const PassFacts& grad = facts.grad;
  const PassFacts& no_grad = facts.no_grad;
  const PassFacts& inference = facts.inference;
  std::cout << "\n";
  verdict.check(grad.requires_grad && grad.has_grad_fn,
                "with grad (even in eval mode) the output heads a graph");
  verdict.check(!no_grad.requires_grad && !no_grad.has_grad_fn,
                "under NoGradGuard the output carries no graph");
  verdict.check(!inference.requires_grad && !inference.has_grad_fn && inference.is_inference,
                "under InferenceMode the output is an inference tensor without a graph");
  verdict.check(no_grad.peak_bytes < grad.peak_bytes,
                "the no-grad peak memory is below the with-grad peak", peak_ratio(no_grad, grad));
  std::printf("  time: no_grad %.2fx and inference mode %.2fx the speed of a pass with grad\n",
              grad.time.median_s / no_grad.time.median_s,
              grad.time.median_s / inference.time.median_s);

  const std::string error = inference_tensor_error(model, x);
  if (!error.empty()) std::cout << "  autograd on an inference tensor: " << error << "\n";
  verdict.check(error.find("Inference tensors cannot be saved for backward") != std::string::npos,
                "autograd refuses to save an inference tensor for backward");

  verdict.check(!repeat_is_identical(model, x, /*train_mode=*/true),
                "in train mode, dropout makes two passes differ");
  verdict.check(repeat_is_identical(model, x, /*train_mode=*/false),
                "in eval mode, two passes are identical");
  return verdict.finish("lesson 06 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
