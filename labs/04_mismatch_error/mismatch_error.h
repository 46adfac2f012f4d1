// mismatch_error.h: what lesson 04 teaches, callable from its tests. See mismatch_error.cpp.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace lesson04 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 4;
constexpr std::int64_t kFeatures = 16;
constexpr std::int64_t kClasses = 4;
constexpr std::int64_t kBatch = 8;
/// The stable part of LibTorch's message when an op mixes devices (1.13 and 2.x).
constexpr const char* kMismatchText = "Expected all tensors to be on the same device";

/// A classifier that standardizes its input with stored statistics (buffers), then applies a
/// linear layer. Its state can be created on any device, the meta device included.
struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl(std::int64_t features, std::int64_t classes,
                 const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor mean, scale, weight, bias;
};
TORCH_MODULE(Classifier);

/// Where the demonstration puts the model: the GPU when `device` is CUDA; otherwise the meta
/// device (tensors with shapes but no data), which raises the same error on any machine.
torch::Device model_device_for(const torch::Device& device);

/// The model on `model_device`: built on the CPU and moved (the usual way) when that is a GPU;
/// built directly on the meta device otherwise (LibTorch 1.13 cannot move a module to meta).
Classifier make_model(const torch::Device& model_device);

/// The device of a model's parameters.
torch::Device device_of(Classifier& model);

/// The outcome of one forward pass.
struct Attempt {
  bool threw = false;
  std::string message;   ///< first line of the error, no backtrace
  torch::Tensor output;  ///< defined when it ran
};

/// The mistake: a batch left on the CPU fed to the model.
Attempt feed_cpu_batch(Classifier& model);
/// The fix: the batch moved to the model's device first.
Attempt feed_moved_batch(Classifier& model);

/// The HINT the lesson prints for an error message ("" when the message is another error).
std::string hint_for(const std::string& message);

}  // namespace lesson04
