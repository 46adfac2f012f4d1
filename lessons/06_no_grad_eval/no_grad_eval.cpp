// Lesson 06 — evaluation without a graph: eval(), NoGradGuard and InferenceMode.
//
// You will learn:
//   - model->eval() changes what layers DO (dropout stops dropping, batch norm uses its running
//     statistics); it does not stop autograd;
//   - torch::NoGradGuard stops autograd from recording: outputs have no grad_fn, intermediate
//     activations are freed as soon as they are used, so peak memory drops and passes are faster;
//   - c10::InferenceMode goes further (no version counters or view tracking), but its outputs
//     are "inference tensors" that can never be saved for backward;
//   - what each costs, measured: peak memory (CUDA allocator statistics, or the counting CPU
//     allocator) and time.
//
// Run:    build/bin/lesson06_no_grad_eval [--device ...] [--data-dir DIR] [--quick]
// Checks: outputs under no_grad and inference mode carry no graph; the inference tensor is
//         refused by autograd; the no-grad peak memory is below the with-grad peak; in train
//         mode dropout makes outputs differ, in eval mode they are identical.
//         Exit 0 PASS, 1 FAIL, 2 bad flag or missing data.
#include <torch/torch.h>  // defines: torch::NoGradGuard, c10::InferenceMode, torch::nn

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/data.h"     // defines: load_fashion_mnist
#include "common/device.h"   // defines: format_bytes
#include "common/memory.h"   // defines: memory_stats, reset_peak_memory (lesson 07 shows the API)
#include "common/timing.h"   // defines: Timing, time_median, describe, looks_busy
#include "common/verdict.h"  // defines: Verdict, error_message, report_error

namespace lesson06 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 6;
constexpr double kDropout = 0.2;              // probability of zeroing an activation in training
constexpr std::int64_t kQuickSamples = 2000;  // --quick evaluates this many test images
constexpr std::int64_t kEvalBatch = 500;      // images per forward pass of the evaluation
constexpr int kTimedRuns = 7;                 // median of this many passes, after 2 warm-ups

/// The lesson 05 MLP with dropout after each hidden layer.
struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(28 * 28, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 10));
    drop = register_module("drop", torch::nn::Dropout(kDropout));
  }

  //! [forward]
  torch::Tensor forward(const torch::Tensor& x) {
    // One statement per layer, not fc3(drop(relu(fc2(...)))): C++ keeps every temporary of an
    // expression alive until the end of the statement, so a nested call would hold all the
    // activations at once even when nothing needs them any more.
    torch::Tensor h = torch::relu(fc1(x));
    h = drop(h);
    h = torch::relu(fc2(h));
    h = drop(h);
    return fc3(h);
  }
  //! [forward]

  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Classifier);

/// How an evaluation pass is run.
enum class Mode { kGrad, kNoGrad, kInference };

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kGrad:
      return "with grad";
    case Mode::kNoGrad:
      return "NoGradGuard";
    case Mode::kInference:
      return "InferenceMode";
  }
  return "?";
}

/// Evaluates `images` batch by batch under `mode` and returns the logits of all of them, as an
/// evaluation loop that collects predictions does (the model's train/eval state is left as is).
//! [modes]
torch::Tensor evaluate_in_mode(Classifier& model, const torch::Tensor& images, Mode mode) {
  std::optional<torch::NoGradGuard> no_grad;    // records nothing while it lives
  std::optional<c10::InferenceMode> inference;  // no_grad, and no version counters either
  // >>> lab: switch on the guard that `mode` asks for (no_grad or inference)
  if (mode == Mode::kNoGrad) no_grad.emplace();
  if (mode == Mode::kInference) inference.emplace();
  // <<< lab
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

/// Runs the pass in eval mode after one warm-up batch, measuring peak memory with common/'s
/// meter and time.
PassFacts measure_pass(Classifier& model, const torch::Tensor& x, Mode mode,
                       const torch::Device& device, int timed_runs = kTimedRuns) {
  course::install_counting_cpu_allocator();
  model->eval();
  PassFacts facts;
  // Warm up first: the first matmul on a CUDA device creates cuBLAS's handle and its workspace
  // (32 MiB on sm_90), which would be charged to whichever mode is measured first.
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
std::string inference_tensor_error(Classifier& model, const torch::Tensor& x) {
  torch::Tensor logits;
  {
    c10::InferenceMode inference;
    logits = model->forward(x);
  }
  try {
    // Scaling by a trainable weight saves `logits` for backward: not allowed for inference
    // tensors. Use NoGradGuard (or logits.clone() outside inference mode) for such outputs.
    const torch::Tensor loss = (logits * model->fc3->bias.sum()).sum();
    loss.backward();
  } catch (const c10::Error& error) {
    return course::error_message(error);
  }
  return "";
}
//! [inference-error]

/// Two forward passes of the same input: are the outputs identical?
//! [dropout]
bool repeat_is_identical(Classifier& model, const torch::Tensor& x, bool train_mode) {
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
// measure_pass() in each mode, in the order of Mode, with
// one row of the table printed for each.
std::array<PassFacts, 3> measure_modes(Classifier& model, const torch::Tensor& x,
                                       const torch::Device& device) {
  std::cout << "mode            requires_grad  grad_fn  inference  peak memory  held after  "
               "time: median (fastest-slowest)\n";
  std::array<PassFacts, 3> facts;
  bool busy = false;
  for (Mode mode : {Mode::kGrad, Mode::kNoGrad, Mode::kInference}) {
    PassFacts& f = facts[static_cast<int>(mode)];
    f = measure_pass(model, x, mode, device);
    std::printf("%-15s %-14s %-8s %-10s %-12s %-11s %s\n", mode_name(mode),
                f.requires_grad ? "true" : "false", f.has_grad_fn ? "yes" : "none",
                f.is_inference ? "yes" : "no",
                course::format_bytes(static_cast<double>(f.peak_bytes)).c_str(),
                course::format_bytes(static_cast<double>(f.kept_bytes)).c_str(),
                course::describe_ms(f.time).c_str());
    busy = busy || course::looks_busy(f.time);
  }
  if (busy) std::cout << course::busy_note() << "\n";
  return facts;
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
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;

  course::ImageSet test =
      course::load_fashion_mnist(course::find_fashion_mnist(options.data_dir), false);
  const std::int64_t n = options.quick ? kQuickSamples : test.labels.size(0);
  const torch::Tensor x = test.images.slice(0, 0, n).reshape({n, 28 * 28}).to(device);
  torch::manual_seed(options.seed);
  Classifier model;
  model->to(device);
  std::cout << "Evaluating " << n << " test images in batches of " << kEvalBatch << " on " << device
            << ", keeping the logits\n\n";

  const std::array<PassFacts, 3> facts = measure_modes(model, x, device);
  const PassFacts& grad = facts[0];
  const PassFacts& no_grad = facts[1];
  const PassFacts& inference = facts[2];
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
