// Lesson 05 — a GPU-aware training loop: the tutorial's Fashion-MNIST program, in C++.
//
// You will learn:
//   - LibTorch's own data pipeline: a torch::data dataset, .map(Stack<>()) to make batches, and
//     make_data_loader with a batch size, a random order and worker threads (Python's DataLoader);
//   - the three moves the tutorial insists on: the model once, before the optimizer is built, and
//     every batch's features and labels inside the loop, before the forward pass;
//   - the loop itself: forward, loss, zero_grad, backward, step, and the epoch's mean loss;
//   - evaluation with model->eval(), a NoGradGuard and torch::max(outputs, 1).
// Lessons 11 and 12 (going further) make this loop fast and check it against this one.
//
//! [run-checks]
// Run:    build/bin/lesson05_training_loop [--device auto|cpu|cuda|cuda:N] [--epochs N]
//                                          [--batch-size N] [--workers N] [--data-dir DIR]
//                                          [--seed N] [--threads N] [--quick]
// Checks: the test accuracy reaches kAccuracyBar after kEpochs epochs on all 60,000 images
//         (kQuickAccuracyBar for shorter runs), and the epoch loss falls. Exit 0 PASS, 1 FAIL,
//         2 bad flag or missing data (with the package to install), 130 Ctrl-C.
//! [run-checks]
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::data, torch::max

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

#include "common/cli.h"        // defines: Cli, start_lesson (--device, the device line)
#include "common/dataset.h"    // defines: FashionMNIST (torchvision's datasets.FashionMNIST)
#include "common/interrupt.h"  // defines: StopOnInterrupt, stop_requested, Interrupted (Ctrl-C)
#include "common/timing.h"     // defines: Stopwatch, Timing, summarize, describe, timing_note
#include "common/verdict.h"    // defines: Verdict, report_error

namespace lesson05 {

//! [knobs]
// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 5;       // the model's first weights and the batches' order
constexpr int kEpochs = 5;               // the tutorial's: for epoch in range(5)
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
// DataLoader(num_workers=2): threads that gather the next batches while this one trains. The
// tutorial recommends 2, 4 or 8 by the CPU's cores; each is a core the math does not get.
constexpr int kWorkers = 2;
constexpr double kAccuracyBar = 0.85;  // test accuracy after kEpochs on all 60,000 images
// --quick: one epoch on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
//! [knobs]

// ---- 2. Data -----------------------------------------------------------------------------------
//! [data]
// Stack<> turns the dataset's samples into one batch, as Python's DataLoader does: features
// [B, 1, 28, 28] and labels [B], on the host. A loader's type names its dataset and its order.
using Batches =
    torch::data::datasets::MapDataset<course::FashionMNIST, torch::data::transforms::Stack<>>;
using TrainLoader = torch::data::StatelessDataLoader<Batches, torch::data::samplers::RandomSampler>;
using TestLoader =
    torch::data::StatelessDataLoader<Batches, torch::data::samplers::SequentialSampler>;

// DataLoader(train_ds, batch_size=64, shuffle=True), with the num_workers=2 the tutorial advises
std::unique_ptr<TrainLoader> make_train_loader(course::FashionMNIST train_ds,
                                               std::int64_t batch_size, int workers) {
  return torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(train_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(batch_size).workers(workers));
}

// DataLoader(test_ds, batch_size=64): the samples in order.
std::unique_ptr<TestLoader> make_test_loader(course::FashionMNIST test_ds,
                                             std::int64_t batch_size) {
  return torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(test_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(batch_size));
}
//! [data]

// ---- 3. Model ----------------------------------------------------------------------------------
//! [model]
// class ANN(nn.Module): a module is a struct holding its layers, registered by name so that
// parameters(), to(device) and the state_dict find them ("fc1.weight", ..., "out.bias").
struct ANNImpl : torch::nn::Module {
  ANNImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        out(register_module("out", torch::nn::Linear(64, 10))),
        relu(register_module("relu", torch::nn::ReLU())) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), -1});  // [B, 1, 28, 28] -> [B, 784]
    x = relu(fc1(x));
    x = relu(fc2(x));
    return out(x);  // logits: CrossEntropyLoss applies the softmax itself
  }

  torch::nn::Linear fc1, fc2, out;
  torch::nn::ReLU relu;
};
TORCH_MODULE(ANN);  // ANN: a shared pointer to an ANNImpl, hence model->forward(x)
//! [model]

// ---- 4. Training -------------------------------------------------------------------------------
//! [train]
// One epoch: for features, labels in train_loader. Returns total_loss / len(train_loader).
double train_epoch(ANN& model, TrainLoader& train_loader, torch::nn::CrossEntropyLoss& criterion,
                   torch::optim::Adam& optimizer, const torch::Device& device) {
  model->train();
  double total_loss = 0;
  std::int64_t batches = 0;
  for (auto& [features, labels] : train_loader) {  // each batch: .data and .target, on the host
    // >>> lab: copy the batch's features and labels to `device`, where the model is
    features = features.to(device);
    labels = labels.to(device);
    // <<< lab

    torch::Tensor outputs = model->forward(features);
    torch::Tensor loss = criterion(outputs, labels);

    // >>> lab: clear the last step's gradients, backpropagate the loss, take the optimizer's step
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    // <<< lab

    // .item() copies the loss to the host, and on a GPU first waits for every kernel queued so
    // far: once per step, the GPU idles while the host catches up. Lesson 11 keeps the sum on
    // the device and reads it once per epoch.
    total_loss += loss.item<double>();
    ++batches;
    if (course::stop_requested()) {  // Ctrl-C: stop after the step under way (common/interrupt.h)
      throw course::Interrupted("in an epoch, after step " + std::to_string(batches));
    }
  }
  return total_loss / static_cast<double>(batches);
}
//! [train]

// ---- 5. Evaluation -----------------------------------------------------------------------------
//! [evaluate]
// The fraction of the test set classified right: model.eval() and `with torch.no_grad()`.
double evaluate(ANN& model, TestLoader& test_loader, const torch::Device& device) {
  model->eval();
  // >>> lab: evaluation needs no graph: turn gradient recording off until the end of this scope
  torch::NoGradGuard no_grad;
  // <<< lab
  std::int64_t correct = 0, total = 0;
  for (auto& [features, labels] : test_loader) {
    features = features.to(device);
    labels = labels.to(device);

    torch::Tensor outputs = model->forward(features);
    auto [values, predicted] = torch::max(outputs, /*dim=*/1);  // _, predicted = ...

    total += labels.size(0);
    correct += (predicted == labels).sum().item<std::int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}
//! [evaluate]

}  // namespace lesson05

// ---- main: the tutorial's program, step by step ------------------------------------------------
//! [main-start]
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson05.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson05;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  int batch_size = static_cast<int>(kBatchSize);
  int workers = kWorkers;
  course::Cli cli("lesson05_training_loop",
                  "Lesson 05: the tutorial's Fashion-MNIST program, trained on the device.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_option("--workers", workers, "threads loading batches (DataLoader's num_workers)", 0, 16);
  if (auto code = cli.parse(argc, argv)) return *code;

  // 1. Device: the tutorial's torch.device("cuda" if torch.cuda.is_available() else "cpu"), with
  // --device to choose (lesson 01). Prints the device first ("Device: ...").
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);  // tutorials'
  device = course::start_lesson(options, device);  // --device may override it; printed first
  //! [main-start]
  torch::manual_seed(options.seed);  // the same weights and batch order every run

  // 2. Data (--quick: the first kQuickSamples training images, one epoch).
  course::FashionMNIST train_ds(options.data_dir, /*train=*/true,
                                options.quick ? kQuickSamples : -1);
  course::FashionMNIST test_ds(options.data_dir, /*train=*/false);
  const auto train_size = static_cast<std::int64_t>(*train_ds.size());
  auto train_loader = make_train_loader(std::move(train_ds), batch_size, workers);
  auto test_loader = make_test_loader(std::move(test_ds), batch_size);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;

  // 3. Model, moved to the device before the optimizer is built over its parameters, as the
  // tutorial does: ANN().to(device), then optim.Adam(model.parameters(), ...).
  ANN model;
  model->to(device);
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  std::cout << "Fashion-MNIST: " << train_size << " training images, batch " << batch_size << ", "
            << workers << " loader workers, " << epochs << " epoch(s)\n";

  // 4. Training.
  course::StopOnInterrupt ctrl_c;
  std::vector<double> losses, seconds;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    course::Stopwatch watch(device);
    losses.push_back(train_epoch(model, *train_loader, criterion, optimizer, device));
    seconds.push_back(watch.seconds());
    std::printf("Epoch %d, Loss: %.4f\n", epoch + 1, losses.back());
    std::fflush(stdout);  // each epoch's line as it ends, also into a file or a pipe
  }

  // 5. Evaluation.
  const double accuracy = evaluate(model, *test_loader, device);
  std::printf("Test Accuracy: %.4f\n", accuracy);

  const course::Timing t = course::summarize(seconds);
  std::cout << "\nepoch time " << course::describe(t) << ", "
            << static_cast<std::int64_t>(static_cast<double>(train_size) / t.median_s)
            << " samples/s on " << device << "\n";
  std::cout << course::timing_note({t});  // a busy machine, or a single epoch: says so

  //! [verdict]
  // The 0.85 bar is for the full run (all images, >= 5 epochs, batches of <= 64).
  const bool full_run = !options.quick && epochs >= kEpochs && batch_size <= kBatchSize;
  const double bar = full_run ? kAccuracyBar : kQuickAccuracyBar;
  course::Verdict verdict;
  verdict.check(accuracy >= bar, "the test accuracy reaches the bar",
                std::to_string(accuracy) + " vs bar " + std::to_string(bar));
  if (epochs > 1) {
    verdict.check(losses.back() < losses.front(), "the epoch loss falls",
                  std::to_string(losses.front()) + " -> " + std::to_string(losses.back()));
  }
  return verdict.finish("lesson 05 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
//! [verdict]
