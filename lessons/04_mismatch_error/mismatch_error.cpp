// Lesson 04 — the device-mismatch error: what it says, why it happens, and the fix.
//
// You will learn:
//   - the tutorial's golden rule, line for line: a CPU tensor added to a tensor on the device
//     throws "Expected all tensors to be on the same device", and .to(device) fixes it;
//   - the usual cause in a program: the model was moved to the GPU, the batch was not; the fix:
//     move each batch to the model's device (or create it there);
//   - the tutorials' five common mistakes, each with LibTorch's own message, the course's HINT
//     and the fix;
//   - without a GPU, the meta device (shapes, no data) stands in for it where an operation
//     checks devices, and the lesson says where it cannot.
//
// Run:    build/bin/lesson04_mismatch_error [--device auto|cpu|cuda|cuda:N]
// Checks: the tutorial's sum, and a CPU batch fed to the model, raise the mismatch error with a
//         HINT naming the fix and run once moved; each common mistake that can happen here raises
//         an error whose HINT names its fix, and the fix runs. Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::nn::Module, torch::addmm, torch::save, c10::Error

#include <cstdint>
#include <exception>
#include <iostream>
#include <string>

#include "common/cli.h"               // defines: Cli, start_lesson
#include "common/temporary_folder.h"  // defines: TemporaryFolder (where mistake 5's file goes)
#include "common/verdict.h"           // defines: Verdict, error_message, hint_for, print_error

namespace lesson04 {

// ---- knobs -----------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 4;
constexpr std::int64_t kFeatures = 16;  // each example's features, the model's input
constexpr std::int64_t kClasses = 4;    // the model's outputs
constexpr std::int64_t kBatch = 8;      // examples in a batch
//! [knobs]
/// The stable part of LibTorch's message when an op mixes devices (1.13 and 2.x).
constexpr const char* kMismatchText = "Expected all tensors to be on the same device";

// ---- 1. The tutorial's golden rule -------------------------------------------------------------
//! [golden-rule]
/// What the tutorial's lines did, for main's checks.
struct GoldenRule {
  bool demonstrated = false;  ///< the mismatch was tried (the device is not the CPU)
  std::string error;          ///< LibTorch's message, without its C++ backtrace
  torch::Tensor result;       ///< the sum after the fix (undefined when not demonstrated)
};

GoldenRule golden_rule(const torch::Device& device) {
  GoldenRule rule;
  // Create one tensor on the CPU and one on the device
  torch::Tensor tensor_cpu = torch::randn({3, 4});
  torch::Tensor tensor_gpu = torch::randn({3, 4}).to(device);
  std::cout << "Device of tensor_cpu: " << tensor_cpu.device() << "\n";
  std::cout << "Device of tensor_gpu: " << tensor_gpu.device() << "\n";

  // The tutorial asks `device.type == 'cuda'`; any device but the CPU shows the error (main
  // passes the meta device where there is no GPU: model_device_for below).
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

//! [attempt]
/// The device of a model's parameters.
torch::Device device_of(Classifier& model) { return model->parameters().front().device(); }

/// The outcome of one try: its output, or the error it threw.
struct Attempt {
  bool threw = false;
  std::string message;   ///< first line of the error, no backtrace
  torch::Tensor output;  ///< defined when it ran
};

namespace {  // attempt() and attempt_forward(): this file's own helpers, no other file calls them
/// Runs `run` (any callable returning a tensor, e.g. a lambda `[&] { return ...; }`, Python's
/// `lambda: ...`), catching the error it throws as Python's `except RuntimeError as e` would.
template <typename Run>
Attempt attempt(Run&& run) {
  Attempt result;
  try {
    result.output = run();
  } catch (const std::exception& error) {  // c10::Error, LibTorch's errors, is one
    result.threw = true;
    result.message = course::error_message(error);
  }
  return result;
}

// The model's forward pass on `batch`, as an attempt.
Attempt attempt_forward(Classifier& model, const torch::Tensor& batch) {
  return attempt([&] { return model->forward(batch); });
}
}  // namespace
//! [attempt]

/// The mistake: a batch left on the CPU fed to the model.
//! [mistake]
Attempt feed_cpu_batch(Classifier& model) {
  const torch::Tensor batch = torch::randn({kBatch, kFeatures});  // on the CPU
  return attempt_forward(model, batch);  // the model is elsewhere: this throws
}
//! [mistake]

/// The fix: the batch moved to the model's device first.
//! [fix]
Attempt feed_moved_batch(Classifier& model) {
  const torch::Tensor batch = torch::randn({kBatch, kFeatures});
  // Move the batch to where the model's parameters are. In a training loop: once per batch.
  // >>> lab: feed `batch` to the model where the model is (return attempt_forward(model, ...))
  return attempt_forward(model, batch.to(device_of(model)));
  // <<< lab
}
//! [fix]

// ---- 3. The tutorials' common mistakes ---------------------------------------------------------
// Each function below makes one mistake, or its fix, on `device`: a GPU, or the meta device in its
// place (model_device_for). What LibTorch raises is printed with course::hint_for's HINT.

//! [mistake-model]
// Mistake 1: the model left on the host. The batch went to the device, the model did not.
Attempt model_left_on_host(const torch::Device& device) {
  Classifier model = make_model(torch::kCPU);  // Python: model = ANN(), and no model.to(device)
  return attempt_forward(model, torch::randn({kBatch, kFeatures}).to(device));
}

// The fix: the model on the device too, once, right after it is built (model.to(device)).
Attempt model_moved(const torch::Device& device) {
  // >>> lab: build the model on `device` (make_model), then feed it the batch there
  Classifier model = make_model(device);
  return attempt_forward(model, torch::randn({kBatch, kFeatures}).to(device));
  // <<< lab
}
//! [mistake-model]

//! [mistake-labels]
// Mistake 2: the labels left on the host. Python: loss = criterion(outputs, labels)
Attempt loss_of(const torch::Tensor& outputs, const torch::Tensor& labels) {
  torch::nn::CrossEntropyLoss criterion;
  return attempt([&] { return criterion(outputs, labels); });
}

// Mistake 3: predictions on the device compared with labels on the host. Python:
//   _, predicted = torch.max(outputs, 1)
//   correct += (predicted == labels).sum().item()
Attempt correct_of(const torch::Tensor& outputs, const torch::Tensor& labels) {
  return attempt([&] {
    // torch::max returns (values, indices) as a std::tuple; std::get<1> takes the indices.
    const torch::Tensor predicted = std::get<1>(torch::max(outputs, /*dim=*/1));
    return (predicted == labels).sum();  // .item() left out: meta tensors hold no number
  });
}
//! [mistake-labels]

//! [mistake-cuda]
// Mistake 4: .cuda() (or .to(torch::kCUDA)) written into the program. It asks for CUDA whether
// or not this LibTorch was built with it and this machine has a GPU.
Attempt cuda_everywhere() {
  return attempt([] { return torch::randn({kBatch, kFeatures}).cuda(); });
}

// The fix: the device chosen once (the tutorial's first line), then .to(device) everywhere.
Attempt to_device() {
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  return attempt([&] { return torch::randn({kBatch, kFeatures}).to(device); });
}
//! [mistake-cuda]

//! [mistake-checkpoint]
// Mistake 5: a file saved on a GPU, loaded without naming a device (Python: torch.load(path)).
// Each tensor goes back to the device it was saved from: on a machine without one, that fails.
Attempt load_without_device(const std::string& path) {
  Classifier model = make_model(torch::kCPU);
  return attempt([&] {
    torch::load(model, path);
    return model->weight;  // where the loaded weights are
  });
}

// The fix: name the device. Python: torch.load(path, map_location=device)
Attempt load_onto(const std::string& path, const torch::Device& device) {
  Classifier model = make_model(torch::kCPU);
  return attempt([&] {
    torch::load(model, path, device);
    return model->weight;
  });
}
//! [mistake-checkpoint]

/// Saves a model whose tensors live on `device` (a GPU: the file mistake 5 loads).
void save_on(const torch::Device& device, const std::string& path) {
  torch::save(make_model(device), path);
}

/// Where a load put the weights: their device, or the error when it threw.
std::string landed_on(const Attempt& load) {
  return load.threw ? load.message : load.output.device().str();
}

/// "8x4": the shape of what `run` returned ("none" when it threw).
std::string shape_of(const Attempt& run) {
  if (run.threw) return "none";
  return std::to_string(run.output.size(0)) + "x" + std::to_string(run.output.size(1));
}

/// Prints the error of `mistake` with the course's HINT under it, then checks that it raised
/// one whose HINT names a fix, and that `fixed` ran with its result on `where`.
void report(course::Verdict& verdict, const std::string& what, const Attempt& mistake,
            const Attempt& fixed, const torch::Device& where) {
  const std::string hint = course::hint_for(mistake.message);
  if (mistake.threw) course::print_error(mistake.message, hint);
  verdict.check(mistake.threw && hint.find("to(device)") != std::string::npos,
                what + " raises an error with a HINT naming the fix");
  verdict.check(!fixed.threw && fixed.output.device() == where,
                "the fix runs, its result on " + where.str(), fixed.message);
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
  // The tutorials' first line; --device may override it (start_lesson prints the device first).
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  device = course::start_lesson(options, device);
  // Where the mistakes are made: the GPU, or the meta device in its place.
  const torch::Device gpu = model_device_for(device);
  course::Verdict verdict;
  torch::manual_seed(options.seed);

  std::cout << "The tutorial's golden rule (tutorial 003, part 2.1), on " << device << ":\n";
  GoldenRule rule = golden_rule(device);
  if (!rule.demonstrated) {
    std::cout << "\nThe same lines with the meta device (shapes, no numbers) in the GPU's place:\n";
    rule = golden_rule(gpu);
  }
  const std::string on = rule.result.device().str();
  verdict.check(rule.error.find(kMismatchText) != std::string::npos,
                "tensor_cpu + tensor_gpu (on " + on + ") raises the mismatch error");
  verdict.check(!rule.result.is_cpu() && rule.result.sizes() == torch::IntArrayRef({3, 4}),
                "the sum runs once both tensors are on " + on);

  std::cout << "\nThe same mistake in a program: a model on the device, a batch on the CPU\n";
  Classifier model = make_model(gpu);
  if (gpu.is_meta()) {
    std::cout << "No GPU in use: the model goes to the meta device, which raises the same error\n"
                 "  as a GPU would here: its first op, x - mean, checks devices. (With a GPU, the\n"
                 "  message names the two devices, e.g. cuda:0 and cpu.)\n";
  }
  std::cout << "Model on " << device_of(model) << "; feeding it a batch on cpu...\n";

  const Attempt mistake = feed_cpu_batch(model);
  if (mistake.threw) {
    course::print_error(mistake.message, course::hint_for(mistake.message));
  }
  verdict.check(mistake.threw && mistake.message.find(kMismatchText) != std::string::npos,
                "a CPU batch fed to a model on " + gpu.str() + " raises the mismatch error");
  verdict.check(course::hint_for(mistake.message).find(".to(device)") != std::string::npos,
                "the error gets a HINT naming the fix");

  std::cout << "Fix: batch.to(" << device_of(model) << ") before the forward pass...\n";
  const Attempt fixed = feed_moved_batch(model);
  const bool right_shape =
      !fixed.threw && fixed.output.sizes() == torch::IntArrayRef({kBatch, kClasses});
  verdict.check(right_shape && fixed.output.device() == gpu,
                "the moved batch runs: output " + shape_of(fixed) + " on " + gpu.str());
  if (gpu.is_meta()) {
    std::cout << "  (meta tensors carry shapes and dtypes but no numbers: nothing to print)\n";
  } else {
    std::cout << "  first row of the output: " << fixed.output[0].to(torch::kCPU) << "\n";
  }

  std::cout << "\nThe tutorials' common mistakes, on " << gpu << " and cpu:\n";
  std::cout << "\nMistake 1: the model left on cpu, the batch moved to " << gpu << "\n";
  report(verdict, "mistake 1", model_left_on_host(gpu), model_moved(gpu), gpu);

  const torch::Tensor outputs = torch::randn({kBatch, kClasses}).to(gpu);  // the model's output
  const torch::Tensor labels = torch::randint(kClasses, {kBatch});         // on the host
  //! [labels-fix]
  const torch::Tensor labels_on_device = labels.to(gpu);  // the fix: labels = labels.to(device)
  //! [labels-fix]
  std::cout << "\nMistake 2: criterion(outputs, labels), outputs on " << gpu << ", labels on cpu\n";
  const Attempt loss = loss_of(outputs, labels);
  if (gpu.is_meta() && !loss.threw) {
    std::cout << "  no error: the loss came back on " << loss.output.device()
              << ": the loss does not check meta against cpu.\n";
    std::cout << "  On a GPU it is the mismatch error (this lesson's run on a GPU shows it).\n";
    verdict.check(!loss_of(outputs, labels_on_device).threw, "the fix runs on " + gpu.str());
  } else {
    report(verdict, "mistake 2", loss, loss_of(outputs, labels_on_device), gpu);
  }

  std::cout << "\nMistake 3: (predicted == labels).sum(), predicted on " << gpu
            << ", labels on cpu\n";
  const Attempt compared = correct_of(outputs, labels);
  const Attempt compared_on_device = correct_of(outputs, labels_on_device);
  report(verdict, "mistake 3", compared, compared_on_device, gpu);

  std::cout << "\nMistake 4: .cuda() written into the program\n";
  const Attempt cuda = cuda_everywhere();
  // Whether the machine has CUDA, whatever --device chose: .cuda() does not ask which device.
  if (torch::cuda::is_available()) {  // it runs here; on a machine without CUDA it raises
    std::cout << "  this machine has CUDA: .cuda() runs here, and fails on one without\n";
    const Attempt fixed = to_device();
    verdict.check(!cuda.threw && cuda.output.is_cuda(), ".cuda() runs where there is CUDA");
    verdict.check(!fixed.threw && fixed.output.is_cuda(), ".to(device) runs too, on cuda");
  } else {
    report(verdict, "mistake 4 (.cuda() without CUDA)", cuda, to_device(), torch::kCPU);
  }

  std::cout << "\nMistake 5: a file saved on a GPU, loaded without naming a device\n";
  if (gpu.is_cuda()) {
    const course::TemporaryFolder folder("lesson04-");
    const std::string path = folder.file("saved_on_gpu.pt");
    save_on(gpu, path);
    const Attempt back = load_without_device(path);
    const Attempt mapped = load_onto(path, torch::kCPU);
    std::cout << "  torch::load(model, path): the weights land on " << landed_on(back)
              << " (where they were saved); torch::load(model, path, torch::kCPU): on "
              << landed_on(mapped) << "\n";
    verdict.check(!back.threw && back.output.device() == gpu,
                  "loaded without a device, the weights go back to " + gpu.str());
    verdict.check(!mapped.threw && mapped.output.is_cpu(),
                  "loaded onto cpu (map_location), on cpu");
  } else {
    std::cout << "  (skipped: needs CUDA) a file saved on a GPU is needed: on a machine without "
                 "one,\n  torch::load(model, path) fails; torch::load(model, path, device) "
                 "loads it\n";
  }
  return verdict.finish("lesson 04 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
