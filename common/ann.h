// ann.h defines: the tutorials' Fashion-MNIST model (ANN: 784-128-64-10, fc1, fc2, out, ReLU),
// its shuffling data loader, one epoch of its training loop and its test accuracy, for the
// lessons whose topic is none of these: the going-further lessons, and lesson 09, which wraps
// lesson 05's loop (its loader and its test accuracy, with a model of its own). The other core
// lessons write their own, as each tutorial does.
#pragma once

#include <torch/data.h>   // defines: torch::data::StatelessDataLoader, RandomSampler, Stack
#include <torch/nn.h>     // defines: torch::nn::Module, torch::nn::Linear, TORCH_MODULE
#include <torch/optim.h>  // defines: torch::optim::Optimizer
#include <torch/types.h>  // defines: torch::max
#include <torch/utils.h>  // defines: torch::NoGradGuard

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>

#include "common/data.h"     // defines: ImageSet
#include "common/dataset.h"  // defines: FashionMNIST

namespace course {

/// The tutorial's ANN: its layers made in the tutorial's order (fc1, fc2, out), so that one seed
/// gives the same first weights as a core lesson's ANN, and its state_dict has the tutorial's
/// names ("fc1.weight", ..., "out.bias").
struct ANNImpl : torch::nn::Module {
  ANNImpl();
  torch::Tensor forward(torch::Tensor x);  // x.view(x.size(0), -1), then the three layers
  torch::nn::Linear fc1, fc2, out;
  torch::nn::ReLU relu;
};
TORCH_MODULE(ANN);

using TrainBatches =
    torch::data::datasets::MapDataset<FashionMNIST, torch::data::transforms::Stack<>>;
using TrainLoader =
    torch::data::StatelessDataLoader<TrainBatches, torch::data::samplers::RandomSampler>;

/// The FLOPs one training sample costs the ANN: its forward pass and its weights' gradients are a
/// multiply-add per weight each, its inputs' gradients one per weight of fc2 and out (the images
/// need none). Over an epoch's samples, over a device's matmul_rate() (common/timing.h): the
/// epoch's compute floor.
constexpr double kTrainingFlopsPerSample =
    2.0 * 2 * (784 * 128 + 128 * 64 + 64 * 10) + 2.0 * (128 * 64 + 64 * 10);

/// DataLoader(train_ds, batch_size=batch_size, shuffle=True) with `workers` threads: the
/// RandomSampler draws an order from the CPU generator when the loader is made and when each
/// epoch begins; the batches come in that order whatever the number of workers.
std::unique_ptr<TrainLoader> make_train_loader(const FashionMNIST& train_ds,
                                               std::int64_t batch_size, int workers);

/// One epoch of the tutorial's loop (features.to(device), labels.to(device), forward, cross
/// entropy, zero_grad, backward, step), `model` in train mode: its steps and mean loss. Under a
/// StopOnInterrupt, a Ctrl-C ends it after the step under way: throws Interrupted ("after step N").
std::pair<std::int64_t, double> train_epoch(ANN& model, torch::optim::Optimizer& optimizer,
                                            TrainLoader& loader, const torch::Device& device);

/// The fraction of `test` that `model` (on `device`) classifies right, in eval mode under
/// NoGradGuard, taking the class with torch::max(outputs, 1) as the tutorial does. `Model` is
/// this ANN or a lesson's own (a module holder whose forward takes the images, as the tutorial's).
template <typename Model>
double test_accuracy(Model& model, const ImageSet& test, const torch::Device& device) {
  model->eval();
  torch::NoGradGuard no_grad;
  const auto predicted = std::get<1>(torch::max(model->forward(test.images.to(device)), 1));
  return (predicted == test.labels.to(device)).sum().template item<double>() /
         static_cast<double>(test.labels.size(0));
}

}  // namespace course
