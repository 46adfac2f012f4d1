// no_grad_eval.h: what lesson 06 teaches, callable from its tests. See no_grad_eval.cpp.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "common/timing.h"  // defines: course::Timing

namespace lesson06 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 6;
constexpr double kDropout = 0.2;           // probability of zeroing an activation in training
constexpr std::int64_t kQuickSamples = 2000;  // --quick evaluates this many test images
constexpr std::int64_t kEvalBatch = 500;   // images per forward pass of the evaluation
constexpr int kTimedRuns = 7;              // median of this many passes, after 2 warm-ups

/// The lesson 05 MLP with dropout after each hidden layer.
struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl();
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Classifier);

/// How an evaluation pass is run.
enum class Mode { kGrad, kNoGrad, kInference };
const char* mode_name(Mode mode);

/// Evaluates `images` batch by batch under `mode` and returns the logits of all of them, as an
/// evaluation loop that collects predictions does (the model's train/eval state is left as is).
torch::Tensor evaluate_in_mode(Classifier& model, const torch::Tensor& images, Mode mode);

/// What an evaluation pass produced and cost.
struct PassFacts {
  bool requires_grad = false;  ///< the output asks for gradients
  bool has_grad_fn = false;    ///< the output is the head of a recorded graph
  bool is_inference = false;   ///< the output is an inference tensor
  std::int64_t peak_bytes = 0;  ///< peak memory above the starting point, during the pass
  std::int64_t kept_bytes = 0;  ///< memory still held after it, while its logits are alive
  course::Timing time;          ///< time of a pass: median, fastest and slowest of the runs
};
/// Runs the pass in eval mode after one warm-up batch, measuring peak memory with common/'s
/// meter and time.
PassFacts measure_pass(Classifier& model, const torch::Tensor& x, Mode mode,
                       const torch::Device& device, int timed_runs = kTimedRuns);

/// Feeds an inference-mode output back into autograd and returns LibTorch's error message
/// (empty if, against the rules, no error was raised).
std::string inference_tensor_error(Classifier& model, const torch::Tensor& x);

/// Two forward passes of the same input: are the outputs identical?
bool repeat_is_identical(Classifier& model, const torch::Tensor& x, bool train_mode);

}  // namespace lesson06
