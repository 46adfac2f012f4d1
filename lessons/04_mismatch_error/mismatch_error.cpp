// Lesson 04 — the device-mismatch error: what it says, why it happens, and the fix.
//
// You will learn:
//   - the tutorial's golden rule, line for line: a CPU tensor added to a tensor on the device
//     throws, the C++ catch prints LibTorch's own message, and .to(device) fixes it;
//   - every operation runs on ONE device; give it tensors on two devices and LibTorch stops
//     with "Expected all tensors to be on the same device, but found at least two devices";
//   - the usual cause in a program: the model was moved to the GPU, the batch was not; the fix:
//     move each batch to the model's device (or create it there);
//   - on a machine without a GPU, the meta device (shapes without data) raises the same error,
//     so the lesson shows the real message everywhere; on a GPU it shows the CPU/CUDA case.
//
// Run:    build/bin/lesson04_mismatch_error [--device auto|cpu|cuda|cuda:N]
// Checks: the tutorial's sum of a CPU and a device tensor raises the mismatch error and runs
//         once both are on the device; the CPU batch fed to the model raises it too, the HINT
//         names the fix, and the moved batch gives an output of the right shape on the model's
//         device. Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::nn::Module, torch::addmm, c10::Error

#include <cstdint>
#include <iostream>
#include <string>

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/verdict.h"  // defines: Verdict, error_message, report_error

namespace lesson04 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 4;
constexpr std::int64_t kFeatures = 16;
constexpr std::int64_t kClasses = 4;
constexpr std::int64_t kBatch = 8;
/// The stable part of LibTorch's message when an op mixes devices (1.13 and 2.x).
constexpr const char* kMismatchText = "Expected all tensors to be on the same device";

// ---- 1. The tutorial's golden rule -------------------------------------------------------------
/// What the tutorial's lines did.
struct GoldenRule {
  bool demonstrated = false;  ///< the mismatch was tried (the device is not the CPU)
  std::string error;          ///< LibTorch's message, without its C++ backtrace
  torch::Tensor result;       ///< the sum after the fix (undefined when not demonstrated)
};

//! [golden-rule]
GoldenRule golden_rule(const torch::Device& device) {
  GoldenRule rule;
  // Create one tensor on the CPU and one on the device
  torch::Tensor tensor_cpu = torch::randn({3, 4});
  torch::Tensor tensor_gpu = torch::randn({3, 4}).to(device);
  std::cout << "Device of tensor_cpu: " << tensor_cpu.device() << "\n";
  std::cout << "Device of tensor_gpu: " << tensor_gpu.device() << "\n";

  // The tutorial asks `device.type == 'cuda'`; any device but the CPU shows the error (main
  // passes the meta device where there is no GPU).
  if (device.type() != torch::kCPU) {
    rule.demonstrated = true;
    try {
      torch::Tensor result = tensor_cpu + tensor_gpu;  // This throws
    } catch (const c10::Error& e) {
      // Python: except RuntimeError as e. The message without LibTorch's C++ backtrace:
      rule.error = e.what_without_backtrace();
      std::cout << "\nError encountered: " << rule.error << "\n";
      std::cout << "This error occurred because the two tensors are on different devices.\n";
    }
    // The fix: move the CPU tensor to the device before the operation
    torch::Tensor tensor_cpu_on_gpu = tensor_cpu.to(device);
    rule.result = tensor_cpu_on_gpu + tensor_gpu;
    std::cout << "\nSuccessfully performed the operation after moving both tensors to device: "
              << rule.result.device() << "\n";
  } else {
    std::cout << "\nSkipping device mismatch error demo as no GPU is available.\n";
  }
  return rule;
}
//! [golden-rule]

// ---- 2. The same mistake in a program: a model on the device, a batch on the CPU ---------------
/// A classifier that standardizes its input with stored statistics (buffers), then applies a
/// linear layer. Its state can be created on any device, the meta device included.
//! [model]
struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl(std::int64_t features, std::int64_t classes,
                 const torch::Device& device = torch::kCPU) {
    const auto on = torch::TensorOptions().device(device);
    mean = register_buffer("mean", torch::zeros({features}, on));
    scale = register_buffer("scale", torch::ones({features}, on));
    weight = register_parameter("weight", torch::randn({classes, features}, on) * 0.1);
    bias = register_parameter("bias", torch::zeros({classes}, on));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // The first op that sees both x and the model's state is where a mismatch is caught.
    const torch::Tensor z = (x - mean) / scale;
    return torch::addmm(bias, z, weight.t());  // bias + z @ weight.T: what nn.Linear computes
  }

  torch::Tensor mean, scale, weight, bias;
};
TORCH_MODULE(Classifier);

/// Where the demonstration puts the model: the GPU when `device` is CUDA; otherwise the meta
/// device (tensors with shapes but no data), which raises the same error on any machine.
torch::Device model_device_for(const torch::Device& device) {
  return device.is_cuda() ? device : torch::Device(torch::kMeta);
}

/// The model on `model_device`: built on the CPU and moved (the usual way) when that is a GPU;
/// built directly on the meta device otherwise (LibTorch 1.13 cannot move a module to meta).
Classifier make_model(const torch::Device& model_device) {
  if (model_device.is_meta()) return Classifier(kFeatures, kClasses, model_device);
  Classifier model(kFeatures, kClasses);
  model->to(model_device);
  return model;
}
//! [model]

/// The device of a model's parameters.
torch::Device device_of(Classifier& model) { return model->parameters().front().device(); }

/// The outcome of one forward pass: its output, or the error it threw.
struct Attempt {
  bool threw = false;
  std::string message;   ///< first line of the error, no backtrace
  torch::Tensor output;  ///< defined when it ran
};

namespace {  // attempt() is this file's own helper: no other file can call it
Attempt attempt(Classifier& model, const torch::Tensor& batch) {
  Attempt result;
  try {
    result.output = model->forward(batch);
  } catch (const c10::Error& error) {
    result.threw = true;
    result.message = course::error_message(error);
  }
  return result;
}
}  // namespace

/// The mistake: a batch left on the CPU fed to the model.
//! [mistake]
Attempt feed_cpu_batch(Classifier& model) {
  const torch::Tensor batch = torch::randn({kBatch, kFeatures});  // on the CPU
  return attempt(model, batch);  // the model is elsewhere: this throws
}
//! [mistake]

/// The fix: the batch moved to the model's device first.
//! [fix]
Attempt feed_moved_batch(Classifier& model) {
  const torch::Tensor batch = torch::randn({kBatch, kFeatures});
  // Move the batch to where the model's parameters are. In a training loop: once per batch.
  // >>> lab: feed `batch` to the model where the model is (return attempt(model, ...))
  return attempt(model, batch.to(device_of(model)));
  // <<< lab
}
//! [fix]

/// The HINT the lesson prints for an error message ("" when the message is another error).
std::string hint_for(const std::string& message) {
  if (message.find(kMismatchText) == std::string::npos) return "";
  return "move the inputs to the model's device before the forward pass, e.g. "
         "batch.to(model->parameters().front().device()), and create new tensors with "
         "x.options() (or a device) instead of on the CPU by default";
}

}  // namespace lesson04

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson04.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson04;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli(
      "lesson04_mismatch_error",
      "Lesson 04: the 'Expected all tensors to be on the same device' error and its fix.", options);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  torch::manual_seed(options.seed);

  std::cout << "The tutorial's golden rule (tutorial 003, part 2.1), on " << device << ":\n";
  GoldenRule rule = golden_rule(device);
  if (!rule.demonstrated) {
    std::cout << "\nThe same lines with the meta device (shapes, no numbers) in the GPU's place:\n";
    rule = golden_rule(torch::Device(torch::kMeta));
  }
  const std::string on = rule.result.device().str();
  verdict.check(rule.error.find(kMismatchText) != std::string::npos,
                "tensor_cpu + tensor_gpu (on " + on + ") raises the mismatch error");
  verdict.check(!rule.result.is_cpu() && rule.result.sizes() == torch::IntArrayRef({3, 4}),
                "the sum runs once both tensors are on " + on);

  std::cout << "\nThe same mistake in a program: a model on the device, a batch on the CPU\n";
  const torch::Device model_device = model_device_for(device);
  Classifier model = make_model(model_device);
  if (model_device.is_meta()) {
    std::cout << "No GPU in use: the model goes to the meta device, which raises the same error "
                 "as a GPU would.\n  (With a GPU, the message names the two devices, e.g. cuda:0 "
                 "and cpu.)\n";
  }
  std::cout << "Model on " << device_of(model) << "; feeding it a batch on cpu...\n";

  const Attempt mistake = feed_cpu_batch(model);
  if (mistake.threw) {
    course::print_error(mistake.message, hint_for(mistake.message));
  }
  verdict.check(
      mistake.threw && mistake.message.find(kMismatchText) != std::string::npos,
      "a CPU batch fed to a model on " + model_device.str() + " raises the mismatch error");
  verdict.check(!hint_for(mistake.message).empty(), "the error gets a HINT naming the fix");

  std::cout << "Fix: batch.to(" << device_of(model) << ") before the forward pass...\n";
  const Attempt fixed = feed_moved_batch(model);
  const bool right_shape =
      !fixed.threw && fixed.output.sizes() == torch::IntArrayRef({kBatch, kClasses});
  std::string shape = "none";
  if (!fixed.threw) {
    shape = std::to_string(fixed.output.size(0)) + "x" + std::to_string(fixed.output.size(1));
  }
  verdict.check(right_shape && fixed.output.device() == model_device,
                "the moved batch runs: output " + shape + " on " + model_device.str());
  if (model_device.is_meta()) {
    std::cout << "  (meta tensors carry shapes and dtypes but no numbers: nothing to print)\n";
  } else {
    std::cout << "  first row of the output: " << fixed.output[0].to(torch::kCPU) << "\n";
  }
  return verdict.finish("lesson 04 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
