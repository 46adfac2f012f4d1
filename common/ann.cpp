// ann.cpp: the tutorials' ANN, its data loader and one epoch of its loop.
#include "common/ann.h"

#include <torch/torch.h>  // defines: make_data_loader

#include <string>

#include "common/interrupt.h"  // defines: stop_requested, Interrupted

namespace course {

ANNImpl::ANNImpl()
    : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
      fc2(register_module("fc2", torch::nn::Linear(128, 64))),
      out(register_module("out", torch::nn::Linear(64, 10))),
      relu(register_module("relu", torch::nn::ReLU())) {}

torch::Tensor ANNImpl::forward(torch::Tensor x) {
  return out(relu(fc2(relu(fc1(x.view({x.size(0), -1}))))));
}

std::unique_ptr<TrainLoader> make_train_loader(const FashionMNIST& train_ds,
                                               std::int64_t batch_size, int workers) {
  return torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      FashionMNIST(train_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(batch_size).workers(workers));
}

//! [train-epoch]
// for features, labels in train_loader: the tutorial's loop, as lesson 05 writes it.
std::pair<std::int64_t, double> train_epoch(ANN& model, torch::optim::Optimizer& optimizer,
                                            TrainLoader& loader, const torch::Device& device) {
  torch::nn::CrossEntropyLoss criterion;
  model->train();
  std::int64_t steps = 0;
  double total_loss = 0;
  for (auto& [features, labels] : loader) {
    features = features.to(device);
    labels = labels.to(device);
    torch::Tensor outputs = model->forward(features);
    torch::Tensor loss = criterion(outputs, labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    total_loss += loss.item<double>();
    ++steps;
    if (stop_requested()) throw Interrupted("after step " + std::to_string(steps));
  }
  return {steps, total_loss / static_cast<double>(steps)};
}
//! [train-epoch]

}  // namespace course
