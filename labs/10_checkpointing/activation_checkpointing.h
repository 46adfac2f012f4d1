// activation_checkpointing.h: lesson 10's part 6, callable from its tests and benchmarks.
// See activation_checkpointing.cpp.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/verdict.h"  // defines: course::Verdict

namespace lesson10 {

// ---- knobs -----------------------------------------------------------------------------------
// A deep MLP (width x width layers, ReLU, dropout), checkpointed in segments.
constexpr std::int64_t kDeepWidth = 512;
constexpr int kSegment = 4;       // layers recomputed together: one saved input per segment
constexpr double kDropout = 0.1;  // random, so recomputation must replay the RNG
constexpr int kTimedSteps = 3;    // median of this many steps per table cell

/// Runs `block` on `input` without keeping its activations; backward runs it again (with the RNG
/// as it was, when `preserve_rng`) and differentiates that. The block's parameters are inputs of
/// the autograd node too, so they get gradients even when `input` does not require grad.
torch::Tensor checkpoint(torch::nn::Sequential block, const torch::Tensor& input,
                         bool preserve_rng = true);

/// Layers of Linear(width, width) + ReLU + Dropout in segments of kSegment, then Linear(width, 10).
struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(int depth, std::int64_t width);
  /// With `checkpointed`, every segment runs through checkpoint().
  torch::Tensor forward(const torch::Tensor& x, bool checkpointed, bool preserve_rng = true);
  std::vector<torch::nn::Sequential> segments;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(DeepMlp);

/// One training step's cost (forward, loss, backward; no optimizer).
struct StepCost {
  std::int64_t peak_bytes = 0;  ///< peak allocated during the step, above what was live before
  double seconds = 0;           ///< median of kTimedSteps (after one warm-up step)
};
StepCost measure_step(DeepMlp& model, std::int64_t batch, bool checkpointed,
                      const torch::Device& device);

/// Loss and gradients of one step on a fixed batch, the RNG seeded with `seed` first.
struct StepResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> gradients;  ///< in parameters() order
};
StepResult step_gradients(DeepMlp& model, const torch::Tensor& x, const torch::Tensor& y,
                          bool checkpointed, std::uint64_t seed, bool preserve_rng = true);

/// Part 6 of the lesson: the same gradients, then peak memory and time without and with
/// checkpointing; adds its two checks to `verdict`.
void activation_checkpointing_part(const torch::Device& device, bool quick, std::uint64_t seed,
                                   course::Verdict& verdict);

}  // namespace lesson10
