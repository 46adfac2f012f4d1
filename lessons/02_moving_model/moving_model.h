// moving_model.h: what lesson 02 teaches, callable from its tests. See moving_model.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/compare.h"  // defines: course::tolerance_for

namespace lesson02 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 2;
constexpr std::int64_t kInputs = 784;   // a flattened 28x28 image
constexpr std::int64_t kHidden = 128;
constexpr std::int64_t kClasses = 10;
constexpr std::int64_t kBatch = 32;     // rows of the batch used to compare outputs
// fp32 outputs on two devices, relative to the largest (common/compare.h says why 1e-5).
constexpr double kOutputTolerance = course::tolerance_for(torch::kFloat);

/// A small classifier with both kinds of state a module holds: parameters (Linear weights and
/// biases, BatchNorm's affine) and buffers (BatchNorm's running statistics).
struct NetImpl : torch::nn::Module {
  NetImpl();
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(Net);

/// Where one parameter or buffer lives.
struct Placement {
  std::string name;
  bool is_buffer = false;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat;
  std::int64_t bytes = 0;
  const c10::TensorImpl* object = nullptr;  ///< the tensor object (same before and after .to)
  const void* storage = nullptr;            ///< where its numbers are
};

/// Every parameter and buffer of `model`, in registration order.
std::vector<Placement> inventory(const torch::nn::Module& model);

/// What model->to(device) did.
struct MoveReport {
  std::vector<Placement> before;
  std::vector<Placement> after;
  std::int64_t bytes = 0;         ///< parameter + buffer bytes
  bool all_on_device = false;     ///< every parameter and buffer now reports `device`
  bool same_objects = false;      ///< the module still holds the same tensor objects (in place)
  bool storage_changed = false;   ///< the numbers now live in new memory (false for cpu -> cpu)
};
MoveReport move_model(Net& model, const torch::Device& device);

/// Adam over the model's parameters, built after the move.
torch::optim::Adam make_optimizer(Net& model);

/// True when every tensor the optimizer will update is on `device` and is the model's own.
bool optimizer_matches_model(torch::optim::Optimizer& optimizer, Net& model,
                             const torch::Device& device);

/// Where new tensors go. Python's torch.set_default_device(device) makes every factory call
/// (torch.zeros, torch.randn, ...) create on `device`; LibTorch has no such switch, so a new
/// tensor is on the CPU unless its options name a device.
struct NewTensors {
  torch::Device plain{torch::kCPU};  ///< torch::zeros({2}): no device named
  torch::Device told{torch::kCPU};   ///< torch::zeros({2}, device): the device named
  torch::Device moved{torch::kCPU};  ///< torch::zeros({2}).to(device): made, then moved
};
NewTensors where_new_tensors_go(const torch::Device& device);

/// One training step on `device` (random batch made on the CPU and moved); returns the loss.
double train_step(Net& model, torch::optim::Optimizer& optimizer, const torch::Device& device);

}  // namespace lesson02
