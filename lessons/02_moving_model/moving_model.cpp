// Lesson 02 — moving a model: model->to(device) moves every parameter and buffer, in place.
//
// You will learn:
//   - the tutorials' model move, line for line: tutorial 001's SimpleNN, model->to(device), and
//     a loop over named_parameters() that shows where each parameter now is;
//   - a module's state is its parameters AND its buffers (BatchNorm's running statistics);
//     model->to(device) moves all of them, and how many bytes that is;
//   - the move is in place: the module keeps the same tensor objects, whose numbers now live in
//     device memory, so references you took before the move see the new device;
//   - build the optimizer after the move: an optimizer's state (Adam's moments) is created on
//     the device of the parameters when it first steps, and does not follow a later move;
//   - Python's model.cuda() is model->to(torch::kCUDA) (a tensor has .cuda(), a module does not),
//     and there is no torch.set_default_device: a new tensor is on the CPU unless told;
//   - model->to(dtype) converts the state too.
//
// Run:    build/bin/lesson02_moving_model [--device auto|cpu|cuda|cuda:N]
// Checks: every parameter of the tutorial's SimpleNN and every parameter and buffer of the
//         lesson's model ends on the device, the objects are the same ones, the
//         optimizer holds the moved tensors, outputs on the device match the CPU within
//         kOutputTolerance, a new tensor is on the CPU unless its device is named (on CUDA, also
//         .cuda() and to(kCUDA)), and to(kFloat64) converts every parameter.
//         Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::nn, torch::optim

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/compare.h"  // defines: max_rel_diff, tolerance_for
#include "common/device.h"   // defines: format_bytes
#include "common/verdict.h"  // defines: Verdict, error_message, report_error

namespace lesson02 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 2;
constexpr std::int64_t kInputs = 784;  // a flattened 28x28 image
constexpr std::int64_t kHidden = 128;
constexpr std::int64_t kClasses = 10;
constexpr std::int64_t kBatch = 32;  // rows of the batch used to compare outputs
// fp32 outputs on two devices, relative to the largest (common/compare.h says why 1e-5).
constexpr double kOutputTolerance = course::tolerance_for(torch::kFloat);

// ---- 1. The tutorial's model, moved ------------------------------------------------------------
//! [tutorial]
// class SimpleNN(nn.Module), tutorial 001's: each layer registered under its Python name.
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

// model = SimpleNN().to(device), then tutorial 004's check that the parameters moved.
SimpleNN tutorial_model(const torch::Device& device) {
  SimpleNN model;
  // >>> lab: move the model to `device` (one call: every parameter, in place)
  model->to(device);
  // <<< lab
  for (const auto& item : model->named_parameters()) {  // for name, p in model.named_parameters()
    std::cout << "  " << item.key() << ": " << item.value().device() << "\n";
  }
  return model;
}
//! [tutorial]

// ---- 2. Parameters and buffers -----------------------------------------------------------------
/// A small classifier with both kinds of state a module holds: parameters (Linear weights and
/// biases, BatchNorm's affine) and buffers (BatchNorm's running statistics).
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kInputs, kHidden))),
        norm(register_module("norm", torch::nn::BatchNorm1d(kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

/// Where one parameter or buffer lives.
struct Placement {
  std::string name;
  bool is_buffer = false;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat;
  std::int64_t bytes = 0;
  torch::Tensor tensor;           ///< a handle to the tensor object itself
  const void* storage = nullptr;  ///< data_ptr(): the address of its numbers (only compared)
};

/// Every parameter and buffer of `model`, in registration order.
std::vector<Placement> inventory(const torch::nn::Module& model) {
  std::vector<Placement> rows;
  auto add = [&rows](const std::string& name, const torch::Tensor& t, bool is_buffer) {
    // {...}: a Placement, its fields in the order declared above
    rows.push_back({name, is_buffer, t.device(), t.scalar_type(),
                    static_cast<std::int64_t>(t.numel() * t.element_size()), t, t.data_ptr()});
  };
  for (const auto& item : model.named_parameters()) add(item.key(), item.value(), false);
  for (const auto& item : model.named_buffers()) add(item.key(), item.value(), true);
  return rows;
}

/// What model->to(device) did.
struct MoveReport {
  std::vector<Placement> before;
  std::vector<Placement> after;
  std::int64_t bytes = 0;        ///< parameter + buffer bytes
  bool all_on_device = false;    ///< every parameter and buffer now reports `device`
  bool same_objects = false;     ///< the module still holds the same tensor objects (in place)
  bool storage_changed = false;  ///< the numbers now live in new memory (false for cpu -> cpu)
};

//! [move]
MoveReport move_model(Net& model, const torch::Device& device) {
  MoveReport report;
  report.before = inventory(*model);
  // One call moves every parameter and buffer, recursively through the submodules. It is
  // in place: no `model = model->to(...)`, and nothing to re-register.
  // >>> lab: move every parameter and buffer of `model` to `device` (one call, in place)
  model->to(device);
  // <<< lab
  report.after = inventory(*model);
  report.all_on_device = report.same_objects = true;
  for (size_t i = 0; i < report.after.size(); ++i) {
    report.bytes += report.after[i].bytes;
    report.all_on_device &= report.after[i].device == device;
    // is_same: the two handles name one tensor object. data_ptr: where its numbers are.
    report.same_objects &= report.after[i].tensor.is_same(report.before[i].tensor);
    report.storage_changed |= report.after[i].storage != report.before[i].storage;
  }
  return report;
}
//! [move]

/// Where new tensors go. Python's torch.set_default_device(device) makes every factory call
/// (torch.zeros, torch.randn, ...) create on `device`; LibTorch has no such switch, so a new
/// tensor is on the CPU unless its options name a device.
struct NewTensors {
  torch::Device plain{torch::kCPU};  ///< torch::zeros({2}): no device named
  torch::Device told{torch::kCPU};   ///< torch::zeros({2}, device): the device named
  torch::Device moved{torch::kCPU};  ///< torch::zeros({2}).to(device): made, then moved
};

//! [new-tensors]
NewTensors where_new_tensors_go(const torch::Device& device) {
  // Python's torch.set_default_device("cuda") has no C++ counterpart in LibTorch (1.13 or 2.11):
  // the C++ headers have c10::set_default_dtype, for the dtype, and nothing for the device. So
  // name the device where a tensor is made, or make it and move it.
  NewTensors where;
  where.plain = torch::zeros({2}).device();             // torch.zeros(2): on the CPU
  where.told = torch::zeros({2}, device).device();      // torch.zeros(2, device=device)
  where.moved = torch::zeros({2}).to(device).device();  // torch.zeros(2).to(device)
  return where;
}
//! [new-tensors]

/// Adam over the model's parameters, built after the move.
//! [optimizer]
torch::optim::Adam make_optimizer(Net& model) {
  // Built AFTER model->to(device): Adam keeps per-parameter moments that it creates, on the
  // parameters' device, at its first step. Moving the model later would leave them behind.
  // >>> lab: return an Adam (learning rate 1e-3) over the model's parameters
  return torch::optim::Adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  // <<< lab
}
//! [optimizer]

/// True when every tensor the optimizer will update is on `device` and is the model's own.
bool optimizer_matches_model(torch::optim::Optimizer& optimizer, Net& model,
                             const torch::Device& device) {
  const auto& params = optimizer.param_groups().at(0).params();
  const auto model_params = model->parameters();
  if (params.size() != model_params.size()) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].device() != device || !params[i].is_same(model_params[i])) return false;
  }
  return true;
}

/// One training step on `device` (random batch made on the CPU and moved); returns the loss.
double train_step(Net& model, torch::optim::Optimizer& optimizer, const torch::Device& device) {
  model->train();
  const torch::Tensor x = torch::randn({kBatch, kInputs}).to(device);
  const torch::Tensor y = torch::randint(kClasses, {kBatch}).to(device);
  optimizer.zero_grad();
  const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
  loss.backward();
  optimizer.step();
  return loss.item<double>();  // .item() copies one number back, and waits for the GPU
}

// ---- the program's steps (main, below, runs them in order) --------------------------------------
void print_table(const std::vector<Placement>& rows) {
  for (const auto& row : rows) {
    std::cout << "    " << std::left << std::setw(26) << row.name << std::setw(9)
              << (row.is_buffer ? "buffer" : "param") << std::setw(8) << row.device.str()
              << std::setw(8) << c10::toString(row.dtype) << course::format_bytes(row.bytes)
              << "\n";
  }
}

// Prints where every tensor was and is, and checks that the move took all of them, in place, so
// that `first_weight`, a reference taken before the move, sees the new device.
void check_move(const MoveReport& report, const torch::Tensor& first_weight,
                const torch::Device& device, course::Verdict& verdict) {
  std::cout << "Before model->to(" << device << "):\n";
  print_table(report.before);
  std::cout << "After:\n";
  print_table(report.after);
  std::cout << "  " << report.after.size() << " tensors, " << course::format_bytes(report.bytes)
            << (report.storage_changed ? " copied to " + device.str()
                                       : " left where they were (already on " + device.str() + ")")
            << "\n";
  verdict.check(report.all_on_device, "every parameter and buffer is on " + device.str());
  verdict.check(report.same_objects, "the move is in place (same tensor objects)");
  verdict.check(first_weight.device() == device,
                "a reference taken before the move sees the new device",
                "fc1.weight on " + first_weight.device().str());
}

// The mistake the order in main avoids, shown on a GPU: step once on the CPU, then move the
// model; the optimizer's moments stay on the CPU.
void show_optimizer_built_before_move(const torch::Device& device, std::uint64_t seed) {
  if (!device.is_cuda()) {
    std::cout << "  optimizer built before a CPU->GPU move (skipped: needs CUDA)\n";
    return;
  }
  torch::manual_seed(seed);
  Net late;
  torch::optim::Adam early = make_optimizer(late);
  train_step(late, early, torch::kCPU);  // Adam's moments are created on the CPU here
  late->to(device);
  try {
    train_step(late, early, device);
    std::cout << "  optimizer built before the move: the step ran (moments were moved?)\n";
  } catch (const std::exception& error) {
    std::cout << "  optimizer built before the move fails at its next step:\n    "
              << course::error_message(error) << "\n";
  }
}

}  // namespace lesson02

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson02.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson02;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("lesson02_moving_model",
                  "Lesson 02: model->to(device) moves parameters and buffers, in place.", options);
  if (auto code = cli.parse(argc, argv)) return *code;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);  // tutorials'
  device = course::start_lesson(options, device);  // --device may override it; printed first
  course::Verdict verdict;

  torch::manual_seed(options.seed);
  std::cout << "The tutorial's SimpleNN after model->to(" << device << "):\n";
  const SimpleNN simple = tutorial_model(device);
  bool simple_moved = true;
  for (const auto& p : simple->parameters()) simple_moved &= p.device() == device;
  verdict.check(simple_moved, "every parameter of the tutorial's SimpleNN is on " + device.str());

  std::cout << "\nThe lesson's model, with BatchNorm's buffers:\n";
  Net model;
  model->eval();  // BatchNorm uses its running statistics: outputs are comparable across devices
  const torch::Tensor batch = torch::randn({kBatch, kInputs});
  const torch::Tensor cpu_output = model->forward(batch);
  // A reference taken before the move: after it, the same object reports the new device.
  const torch::Tensor first_weight = model->fc1->weight;
  check_move(move_model(model, device), first_weight, device, verdict);

  //! [compare]
  // The batch must be on the model's device too (lesson 04 shows what happens otherwise).
  const torch::Tensor device_output = model->forward(batch.to(device)).to(torch::kCPU);
  const double diff = course::max_rel_diff(device_output, cpu_output);  // common/compare.h
  //! [compare]
  verdict.check(diff <= kOutputTolerance, "outputs on " + device.str() + " match the CPU",
                "max relative diff " + std::to_string(diff));

  torch::optim::Adam optimizer = make_optimizer(model);
  verdict.check(optimizer_matches_model(optimizer, model, device),
                "the optimizer, built after the move, holds the moved parameters");
  const double loss = train_step(model, optimizer, device);
  verdict.check(std::isfinite(loss), "a training step runs on " + device.str(),
                "loss " + std::to_string(loss));
  show_optimizer_built_before_move(device, options.seed);

  const NewTensors where = where_new_tensors_go(device);
  std::cout << "New tensors: torch::zeros({2}) on " << where.plain
            << ", torch::zeros({2}, device) on " << where.told
            << ", torch::zeros({2}).to(device) on " << where.moved << "\n";
  verdict.check(where.plain.is_cpu() && where.told == device && where.moved == device,
                "a new tensor is on the CPU unless its device is named (no default device)");
  if (device.is_cuda()) {
    //! [cuda]
    // Python's x.cuda() and model.cuda(): a tensor has .cuda() in C++ too; a module does not,
    // and model->to(torch::kCUDA) does the same (to the current GPU, cuda:0 unless changed).
    const torch::Tensor on_gpu = torch::ones({2}).cuda();
    Net other;
    other->to(torch::kCUDA);
    //! [cuda]
    verdict.check(on_gpu.is_cuda() && other->fc1->weight.is_cuda(),
                  "x.cuda() and model->to(torch::kCUDA) put the tensor and the model on the GPU");
  }

  //! [dtype]
  model->to(torch::kFloat64);  // converts the state; inputs must then be float64 too
  //! [dtype]
  bool all_double = true;
  for (const auto& p : model->parameters()) all_double &= p.scalar_type() == torch::kFloat64;
  verdict.check(all_double, "model->to(kFloat64) converts every parameter");
  return verdict.finish("lesson 02 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
