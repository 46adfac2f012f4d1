// Exercise answer (lesson 02) — tutorial 001's "Full Training Loop on GPU", in C++.
//
// Tutorial 001's SimpleNN (fc1: Linear(3, 10), relu, fc2: Linear(10, 2)), moved to the device,
// trained with CrossEntropyLoss and SGD (lr 0.01) on dummy data made on the CPU and moved: 100
// random inputs [100, 3] and random labels 0 or 1, 5 epochs of one full-batch step each,
// translated line for line.
//
// Run:    build/bin/exercise_simple_nn [--device auto|cpu|cuda|cuda:N] [--seed N] [--threads N]
//         (--quick is accepted, as by every lesson: the run is already short)
// Checks: every parameter of SimpleNN is on the device, and the optimizer, built after the move,
//         holds those same tensors; the outputs are on the device, one row of 2 logits per input;
//         the losses are finite and the last epoch's loss is below the first's (each epoch is one
//         gradient step on the same 100 samples, with a small learning rate: each step lowers
//         the loss on them). Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::nn, torch::optim

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/cli.h"      // defines: Cli, start_lesson (--device, the device line)
#include "common/verdict.h"  // defines: Verdict, report_error

namespace exercise_simple_nn {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 1;      // the first weights and the dummy data
constexpr double kLearningRate = 0.01;  // optim.SGD(model.parameters(), lr=0.01)
constexpr std::int64_t kSamples = 100;  // inputs = torch.randn(100, 3)
constexpr std::int64_t kClasses = 2;    // labels = torch.randint(0, 2, (100,))
constexpr int kNumEpochs = 5;           // the tutorial's num_epochs

//! [model]
// class SimpleNN(nn.Module): each layer registered under its Python name (lesson 02).
struct SimpleNNImpl : torch::nn::Module {
  SimpleNNImpl()
      : fc1(register_module("fc1", torch::nn::Linear(3, 10))),
        fc2(register_module("fc2", torch::nn::Linear(10, 2))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = fc2(x);
    return x;
  }

  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(SimpleNN);
//! [model]

}  // namespace exercise_simple_nn

// ---- main: the tutorial's program, step by step -------------------------------------------------
int main(int argc, char** argv) try {
  using namespace exercise_simple_nn;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("exercise_simple_nn",
                  "Tutorial 001's full training loop: SimpleNN trained with SGD on the device.",
                  options);
  if (auto code = cli.parse(argc, argv)) return *code;

  // Check for GPU: torch.device('cuda' if torch.cuda.is_available() else 'cpu'), or --device.
  const torch::Device device = course::start_lesson(options);
  torch::manual_seed(options.seed);

  //! [train]
  // Instantiate the model and move it to the device (in place: C++'s to() returns nothing).
  SimpleNN model;
  model->to(device);

  // A loss function, and an optimizer built over the moved parameters.
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));

  // Dummy data, made on the CPU and moved to the device.
  torch::Tensor inputs = torch::randn({kSamples, 3}).to(device);
  torch::Tensor labels = torch::randint(0, kClasses, {kSamples}).to(device);

  // Training loop: one step on the whole batch per epoch.
  std::vector<double> losses;
  torch::Tensor outputs;
  for (int epoch = 0; epoch < kNumEpochs; ++epoch) {
    optimizer.zero_grad();                            // zero the gradients
    outputs = model->forward(inputs);                 // forward pass
    torch::Tensor loss = criterion(outputs, labels);  // compute loss
    loss.backward();                                  // backward pass
    optimizer.step();                                 // update parameters

    losses.push_back(loss.item<double>());  // .item() copies the loss back (waits for the GPU)
    std::printf("Epoch [%d/%d], Loss: %.4f\n", epoch + 1, kNumEpochs, losses.back());
  }
  //! [train]

  //! [check]
  // Where everything ended: the model's parameters, the optimizer's, the outputs.
  bool params_on_device = true;
  for (const auto& p : model->parameters()) params_on_device &= p.device() == device;
  const auto& held = optimizer.param_groups().at(0).params();
  const auto own = model->parameters();
  bool optimizer_holds_them = held.size() == own.size();
  for (std::size_t i = 0; optimizer_holds_them && i < held.size(); ++i) {
    optimizer_holds_them = held[i].is_same(own[i]);
  }
  //! [check]

  course::Verdict verdict;
  verdict.check(params_on_device && optimizer_holds_them,
                "every parameter of SimpleNN is on " + device.str() +
                    ", and the optimizer holds the same tensors");
  verdict.check(
      outputs.device() == device && outputs.size(0) == kSamples && outputs.size(1) == kClasses,
      "the outputs are on " + device.str() + ", 2 logits per input",
      "[" + std::to_string(outputs.size(0)) + ", " + std::to_string(outputs.size(1)) + "]");
  bool finite = true;
  for (double loss : losses) finite &= std::isfinite(loss);
  verdict.check(finite && losses.back() < losses.front(), "the loss falls over the epochs",
                std::to_string(losses.front()) + " -> " + std::to_string(losses.back()));
  return verdict.finish("tutorial 001's SimpleNN trained on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
