// fast_training_loop.h: what lesson 09 trains, as lesson 11 defined it when lesson 09 was written:
// the 784-128-64-10 MLP with all its parameters in one flat tensor (one all-reduce per step),
// Adam over that tensor, the test accuracy, and the knobs lesson 09 shares. No lesson links
// another: this is lesson 09's own copy, kept under lesson 11's names so that lesson 09's sources
// build unchanged; it goes when lesson 09 trains a model of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "common/data.h"  // defines: ImageSet, take

namespace lesson11 {

constexpr int kEpochs = 5;
constexpr double kLearningRate = 1e-3;  // Adam
constexpr double kAccuracyBar = 0.85;   // test accuracy after kEpochs on all 60,000 images
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
constexpr std::int64_t kEvalBatch = 1000;

// The classifier: 784 -> 128 -> ReLU -> 64 -> ReLU -> 10 (logits).
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        fc3(register_module("fc3", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// Every parameter (and its .grad()) a view into one of these two tensors.
struct FlatParameters {
  torch::Tensor values;     // the optimizer's only parameter
  torch::Tensor gradients;  // values.grad(); backward accumulates into it in place
};

inline FlatParameters flatten_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> params = model.parameters();
  std::int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  FlatParameters flat;
  flat.values = torch::empty({total}, params.front().options().requires_grad(false));
  flat.gradients = torch::zeros({total}, flat.values.options());
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& p : params) {
    const std::int64_t n = p.numel();
    torch::Tensor values = flat.values.slice(0, offset, offset + n).view(p.sizes());
    values.copy_(p);
    p.set_data(values);
    p.mutable_grad() = flat.gradients.slice(0, offset, offset + n).view(p.sizes());
    offset += n;
  }
  flat.values.mutable_grad() = flat.gradients;
  return flat;
}

struct Trainer {
  Mlp model;
  FlatParameters flat;
  std::unique_ptr<torch::optim::Adam> optimizer;
};

// A seeded model moved to `device`, then flattened, then given its optimizer (in this order).
inline Trainer make_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);
  Trainer trainer;
  trainer.model->to(device);
  trainer.flat = flatten_parameters(*trainer.model);
  trainer.optimizer = std::make_unique<torch::optim::Adam>(
      std::vector<torch::Tensor>{trainer.flat.values}, torch::optim::AdamOptions(kLearningRate));
  return trainer;
}

// Fraction of `data` classified correctly, evaluated on `device` without a graph.
inline double evaluate(Mlp& model, const course::ImageSet& data, const torch::Device& device) {
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor images = data.images.reshape({-1, 28 * 28});
  torch::Tensor correct = torch::zeros({}, torch::dtype(torch::kLong).device(device));
  for (std::int64_t start = 0; start < images.size(0); start += kEvalBatch) {
    const torch::Tensor x = images.slice(0, start, start + kEvalBatch).to(device);
    const torch::Tensor y = data.labels.slice(0, start, start + kEvalBatch).to(device);
    correct += model->forward(x).argmax(1).eq(y).sum();
  }
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(images.size(0));
}

using course::take;  // the first n samples of a split (common/data.h)

}  // namespace lesson11
