// flat_trainer.h defines: the state of lesson 21's fused step, made once: the parameters in one
// flat tensor, Adam's state on the device, and the step's results for each batch size.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>

#include "common/ann.h"              // defines: ANN (the tutorial's fc1, fc2, out)
#include "common/flat_parameters.h"  // defines: FlatParameters (lesson 12's)
#include "common/version.h"          // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace lesson21 {

//! [flat-trainer]
constexpr std::int64_t kClasses = 10;  // the ANN's outputs (its layers: 784, 128, 64, 10)

// The fused step's results for batches of one size, made once: every operator of the step writes
// into one of these (its out= form), so a step makes no tensor of its own. The transposed views
// too: .t() is free for the device, but costs the host t, transpose and as_strided at each call.
struct StepBuffers {
  torch::Tensor h1, h2, logits, log_probs, d_out, d_h2, d_h1;
  torch::Tensor minus_ones, ones;         // -1 at each label (softmax - one_hot); ones: d^T ones
  torch::Tensor total_weight;             // what the loss divides by (B): nll_loss's second result
  torch::Tensor d_out_t, d_h2_t, d_h1_t;  // d_out.t(), d_h2.t(), d_h1.t()
};

struct FlatTrainer {  // the model's parameters in flat.values, their gradients in flat.gradients
  course::ANN model;
  course::FlatParameters flat;
  torch::Tensor fc1_t, fc2_t, out_t;              // the weights transposed: views, made once
  torch::Tensor exp_avg, exp_avg_sq, step;        // Adam's state, on the device
  std::unique_ptr<torch::optim::Adam> optimizer;  // where LibTorch has no fused Adam for the device
  std::map<std::int64_t, StepBuffers> buffers;    // per batch size
};

// Whether LibTorch has a fused Adam kernel for `device`: CUDA's since 1.13, the CPU's since 2.4;
// without one the fused form keeps LibTorch's Adam over the one flat tensor, and says so.
inline bool has_fused_adam(const torch::Device& device) {
  return device.is_cuda() || GPU_LESSONS_TORCH_AT_LEAST(2, 4);
}

inline StepBuffers& buffers_for(FlatTrainer& trainer, std::int64_t rows) {
  StepBuffers& b = trainer.buffers[rows];
  if (!b.h1.defined()) {
    const auto on = trainer.flat.values.options();
    b.h1 = torch::empty({rows, 128}, on), b.d_h1 = torch::empty({rows, 128}, on);
    b.h2 = torch::empty({rows, 64}, on), b.d_h2 = torch::empty({rows, 64}, on);
    b.logits = torch::empty({rows, kClasses}, on), b.log_probs = torch::empty_like(b.logits);
    b.d_out = torch::empty_like(b.logits);
    b.minus_ones = torch::full({rows, 1}, -1.0, on), b.ones = torch::ones({rows}, on);
    b.total_weight = torch::empty({}, on);
    b.d_out_t = b.d_out.t(), b.d_h2_t = b.d_h2.t(), b.d_h1_t = b.d_h1.t();
  }
  return b;
}
//! [flat-trainer]

}  // namespace lesson21
