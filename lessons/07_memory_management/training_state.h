// training_state.h defines: training_state_bytes, what a model's training state weighs in
// tensors: its parameters, their gradients and Adam's state. LibTorch has no call for it (nor
// does PyTorch: a Python program adds up p.numel() * p.element_size() the same way).
#pragma once

#include <torch/nn/module.h>   // defines: torch::nn::Module
#include <torch/optim/adam.h>  // defines: torch::optim::Adam

#include <cstdint>

namespace lesson07 {

/// Bytes in the tensors of a model's training state: its parameters, their gradients (where they
/// exist) and Adam's state (two moments per parameter, and amsgrad's maximum where kept).
std::int64_t training_state_bytes(const torch::nn::Module& model, const torch::optim::Adam& adam);

}  // namespace lesson07
