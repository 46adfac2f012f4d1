// Lesson 23 (going further from 21) — your own CUDA kernel: the tutorial's whole epoch in one
// kernel, shipped as a LibTorch operator that C++ and Python call by name. Lesson 21 took the
// tutorial's training as far as LibTorch's own kernels go: one kernel per operation, each costing
// a microsecond or more even when it does nothing, 28 of them a step. Here one kernel of the
// course's own (epoch_kernel.cuh) does every step of an epoch: the forward pass, the loss, the
// backward pass and Adam, its blocks waiting for each other inside the kernel instead of ending
// it. The operator around it (epoch_op.cpp) is what PyTorch's own functions are: a schema, an
// implementation per device, one name.
//
// You will learn:
//   - how an operator is declared (TORCH_LIBRARY: its schema), implemented for each device
//     (TORCH_LIBRARY_IMPL: a CPU reference in LibTorch's operators, and the CUDA kernel) and found
//     by name: from C++ through the dispatcher, from Python through torch.ops (train_with_op.py);
//   - what a kernel is made of (threads, blocks, warps, shared memory) and how a cooperative
//     launch lets its blocks wait for each other (grid.sync()): epoch_kernel.cuh;
//   - that the operator trains as the tutorial's step does on the same batches, and what an
//     epoch costs against the floors: the arithmetic, and the grid barriers.
//
// Run:    build/bin/lesson23_custom_kernel [--device ...] [--epochs N] [--quick] [--data-dir DIR]
// Checks: one step's loss and gradients equal autograd's (a batch of 64 and a smaller one of 22);
//         the operator's losses over kCheckSteps steps equal the tutorial step's within
//         kStepTolerance; on CUDA the kernel's equal the CPU implementation's; a wrong input is
//         refused with a message naming it; Python's call gives C++'s losses and parameters;
//         each form's test accuracy >= kAccuracyBar (or kQuickAccuracyBar). Exit 0 PASS,
//         1 FAIL, 2 bad flag or missing data.
#include <torch/torch.h>  // defines: torch::randperm, torch::optim::Adam, c10::Dispatcher

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>

#include "common/ann.h"  // defines: ANN, test_accuracy, kTrainingFlopsPerSample (lesson 05's ANN)
#include "common/child_process.h"     // defines: ChildProcess, describe_status
#include "common/cli.h"               // defines: Cli, start_lesson
#include "common/compare.h"           // defines: max_rel_diff, tolerance_for
#include "common/data.h"              // defines: ImageSet, load_fashion_mnist_splits
#include "common/flat_parameters.h"   // defines: FlatParameters, flatten_parameters (lesson 12's)
#include "common/interrupt.h"         // defines: stop_requested (Ctrl-C)
#include "common/report.h"            // defines: EpochStats, run_epochs, print_timed_runs, format
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/timing.h"            // defines: Stopwatch, time_median, matmul_rate
#include "common/verdict.h"           // defines: Verdict, report_error
#include "epoch_floors.h"             // defines: phase_medians_us, print_gpu_floors
#include "epoch_kernel.h"             // defines: kIn, kThreads, kSharedBytes, kGridSyncsPerStep
#include "epoch_op.h"  // defines: kName, TrainEpoch, library_path (the operator's library)
#include "torch_files/state_dict.h"  // defines: read_python_state_dict (Python's torch.save)

namespace lesson23 {

// ---- knobs --------------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 5;       // lesson 05's: the first weights and the batches' order
constexpr int kEpochs = 5;               // the tutorial's: for epoch in range(5)
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr double kAccuracyBar = 0.85;    // test accuracy after kEpochs on all 60,000 images
// --quick: one epoch on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
constexpr int kCheckSteps = 100, kQuickCheckSteps = 20;  // batches the forms are checked on
// Lesson 21's: another kernel rounds a last bit otherwise, and training carries such bits on from
// step to step: ten times fp32's tolerance (common/compare.h), relative.
constexpr double kStepTolerance = 10 * course::tolerance_for(torch::kFloat);
// One step's loss and gradients, relative (max_rel_diff): one computation two ways, fp32's.
constexpr double kGradientTolerance = course::tolerance_for(torch::kFloat);
constexpr int kPythonSteps = 100;  // what Python trains with the operator
constexpr int kSyncsTimed = 1000;  // grid barriers in the kernel that times one
// The course's goal for this kernel's epoch: about 10 us a step for its three grid barriers and
// its arithmetic, set before any GPU ran it; and the 25 ms that lesson 21's graphed epoch missed
// on an H200. Both printed beside the measured time, never checked: a verdict does not depend on
// the machine's speed.
constexpr double kGoalEpochMs = 10, kLesson21GoalMs = 25;
//! [knobs]

using course::ANN;
using course::EpochStats;

// The steps `samples` take in batches of kBatchSize: math.ceil(samples / 64).
constexpr std::int64_t steps_for(std::int64_t samples) {
  return (samples + kBatchSize - 1) / kBatchSize;
}

// ---- 1. the operator, found by name -------------------------------------------------------------
//! [find]
// torch.ops.gpu_lessons.train_epoch in C++: the dispatcher holds every operator registered in
// this process (LibTorch's own and those of the libraries it loaded) by name; typed<>() checks
// that the schema fits the C++ type we call it with. The call then goes to the implementation
// for the device of its tensors.
c10::TypedOperatorHandle<epoch_op::TrainEpoch> train_epoch_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(epoch_op::kName, /*overload_name=*/"")
                             .typed<epoch_op::TrainEpoch>();
  return op;
}
//! [find]

// ---- what the operator trains -------------------------------------------------------------------
//! [op-trainer]
// The tutorial's ANN with its parameters in one flat tensor (each parameter a view of it, in
// model.parameters()'s order: lesson 12's FlatParameters), and Adam's state beside them.
struct OpTrainer {
  ANN model;
  course::FlatParameters flat;
  torch::Tensor exp_avg, exp_avg_sq, step;  // Adam's two moments, and its step count
};

OpTrainer make_op_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the tutorial's first weights
  OpTrainer t;
  t.model->to(device);
  t.flat = course::flatten_parameters(*t.model);
  t.exp_avg = torch::zeros_like(t.flat.values), t.exp_avg_sq = torch::zeros_like(t.flat.values);
  t.step = torch::zeros({}, t.flat.values.options());
  return t;
}

// The steps over `order`'s rows of the images, batches of 64, in one call: on CUDA one launch of
// the kernel. Returns each step's loss, on the device; `clock`, when given, gets the phases' times.
torch::Tensor train_with_op(OpTrainer& t, const torch::Tensor& images, const torch::Tensor& labels,
                            const torch::Tensor& order,
                            const c10::optional<torch::Tensor>& clock = {}) {
  return train_epoch_op().call(t.flat.values, t.flat.gradients, t.exp_avg, t.exp_avg_sq, t.step,
                               images, labels, order, kBatchSize, kLearningRate, clock);
}
//! [op-trainer]

// ---- the reference: the tutorial's step ---------------------------------------------------------
//! [tutorial-step]
struct Trainer {  // model = ANN().to(device); optimizer = optim.Adam(model.parameters(), lr=1e-3)
  ANN model;
  std::unique_ptr<torch::optim::Adam> optimizer;
};

Trainer make_trainer(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the same first weights as the operator's
  Trainer t;
  t.model->to(device);
  t.optimizer = std::make_unique<torch::optim::Adam>(t.model->parameters(),
                                                     torch::optim::AdamOptions(kLearningRate));
  return t;
}

// The tutorial's steps (autograd, LibTorch's Adam) over `order`'s rows, each batch of 64 gathered
// by its rows of `order` on the device (as lesson 21's "resident" form keeps the data there, but
// gathering). Returns each step's loss, on the device: no .item() in the loop.
torch::Tensor train_with_autograd(Trainer& t, const torch::Tensor& images,
                                  const torch::Tensor& labels, const torch::Tensor& order) {
  t.model->train();
  const std::int64_t samples = order.size(0), steps = steps_for(samples);
  torch::Tensor losses = torch::empty({steps}, images.options());
  for (std::int64_t k = 0; k < steps; ++k) {
    const torch::Tensor batch =
        order.narrow(0, k * kBatchSize, std::min(kBatchSize, samples - k * kBatchSize));
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        t.model->forward(images.index_select(0, batch)), labels.index_select(0, batch));
    t.optimizer->zero_grad();
    loss.backward();
    t.optimizer->step();
    losses[k] = loss.detach();
  }
  return losses;
}
//! [tutorial-step]

// ---- 2. the checks ------------------------------------------------------------------------------
//! [device-set]
// The training set on the device: each image a row of 784 floats, as the operator takes them.
struct DeviceSet {
  torch::Tensor images, labels;
};
DeviceSet to_device(const course::ImageSet& set, const torch::Device& device) {
  return {set.images.reshape({-1, epoch_kernel::kIn}).to(device), set.labels.to(device)};
}
//! [device-set]

//! [checks]
// One step on `rows` images from the same weights, by both: the operator's loss and gradients
// against autograd's. Returns the larger relative difference of the two.
double one_step_difference(const DeviceSet& data, std::int64_t rows, const torch::Device& device) {
  const torch::Tensor order = torch::arange(rows, torch::dtype(torch::kLong).device(device));
  OpTrainer op = make_op_trainer(device, kSeed);
  const double op_loss = train_with_op(op, data.images, data.labels, order)[0].item<double>();
  Trainer reference = make_trainer(device, kSeed);
  const double loss =
      train_with_autograd(reference, data.images, data.labels, order)[0].item<double>();
  std::vector<torch::Tensor> gradients;  // autograd's, in the flat tensor's order
  for (const auto& p : reference.model->parameters()) gradients.push_back(p.grad().flatten());
  return std::max(std::abs(op_loss - loss) / std::abs(loss),
                  course::max_rel_diff(op.flat.gradients, torch::cat(gradients)));
}

// The largest relative difference between two runs' losses, step by step.
double relative_difference(const torch::Tensor& got, const torch::Tensor& expected) {
  return ((got - expected).abs() / expected.abs()).max().item<double>();
}

void check_operator(const DeviceSet& data, int steps, const torch::Device& device,
                    course::Verdict& verdict) {
  for (const std::int64_t rows : {kBatchSize, std::int64_t{22}}) {
    const double diff = one_step_difference(data, rows, device);
    verdict.check(diff <= kGradientTolerance,
                  course::format("one step of %lld: the loss and gradients are autograd's",
                                 static_cast<long long>(rows)),
                  course::format("largest relative difference %.2e (tolerance %.0e)", diff,
                                 kGradientTolerance));
  }
  // The same batches for every form: the first `steps` of one order, drawn on the device.
  torch::manual_seed(kSeed);
  const torch::Tensor order =
      torch::randperm(data.labels.size(0), torch::dtype(torch::kLong).device(device))
          .narrow(0, 0, steps * kBatchSize);
  OpTrainer op = make_op_trainer(device, kSeed);
  const torch::Tensor op_losses = train_with_op(op, data.images, data.labels, order);
  Trainer reference = make_trainer(device, kSeed);
  const torch::Tensor losses = train_with_autograd(reference, data.images, data.labels, order);
  const double diff = relative_difference(op_losses, losses);
  verdict.check(
      diff <= kStepTolerance, "the operator trains as the tutorial's step",
      course::format("largest relative loss difference %.2e over %d steps (tolerance %.0e)", diff,
                     steps, kStepTolerance));
  if (!device.is_cuda()) {
    std::printf("  the CUDA kernel against the CPU implementation: (skipped: needs CUDA)\n");
  } else {  // the same start, the same batches: the kernel on the GPU, the reference on the CPU
    OpTrainer on_cpu = make_op_trainer(torch::kCPU, kSeed);
    const torch::Tensor cpu_losses =
        train_with_op(on_cpu, data.images.cpu(), data.labels.cpu(), order.cpu());
    const double cuda_diff = relative_difference(op_losses.cpu(), cpu_losses);
    verdict.check(cuda_diff <= kStepTolerance, "the CUDA kernel trains as the CPU implementation",
                  course::format("largest relative loss difference %.2e over %d steps (tolerance "
                                 "%.0e)",
                                 cuda_diff, steps, kStepTolerance));
  }
  // A wrong input: labels as int32 (Python's default for a list of small ints is int64; a file
  // may hold int32). The operator refuses it before reading anything, naming it.
  try {
    train_with_op(op, data.images, data.labels.to(torch::kInt), order);
    verdict.check(false, "int32 labels are refused", "the operator took them");
  } catch (const c10::Error& e) {
    const std::string said = e.what_without_backtrace();
    verdict.check(said.find("labels must be int64") != std::string::npos,
                  "int32 labels are refused", "\"" + said.substr(0, said.find('\n')) + "\"");
  }
}
//! [checks]

// ---- 3. training --------------------------------------------------------------------------------
//! [epochs]
// One epoch of either form: a new order drawn on the device (DataLoader's shuffle), every step,
// then the losses read once: the one wait for the GPU per epoch.
template <typename Train>
EpochStats epoch_of(const DeviceSet& data, const torch::Device& device, const Train& train) {
  course::Stopwatch watch(device);
  const torch::Tensor order =
      torch::randperm(data.labels.size(0), torch::dtype(torch::kLong).device(device));
  const double loss = train(order).mean().template item<double>();
  // Ctrl-C: the operator trains the whole epoch in one call, so the run stops after it.
  return {loss, watch.seconds(), data.labels.size(0), course::stop_requested()};
}
//! [epochs]

// ---- 4. the operator from Python ----------------------------------------------------------------
// The Python whose torch is this LibTorch: $GPU_LESSONS_PYTHON, else the one CMake found.
std::string python() {
  const char* chosen = std::getenv("GPU_LESSONS_PYTHON");
  return chosen && *chosen ? chosen : LESSON23_PYTHON;
}

// Why Python cannot load this build's operator library, or "" when it can.
std::string why_no_python() {
#ifdef GPU_LESSONS_SANITIZED  // CMake defines it in a build with the sanitizers (scripts/sanitize)
  return "a library built with the sanitizers needs their runtime, which Python has not loaded";
#endif
  return python().empty() ? "no Python with this LibTorch's torch" : "";
}

// train_with_op.py where CMake saw it, else in the tree the lesson runs from (a build carried to
// another machine, run from the tree's root).
std::string python_script() {
  return std::filesystem::exists(LESSON23_SCRIPT) ? LESSON23_SCRIPT
                                                  : "lessons/23_custom_kernel/train_with_op.py";
}

//! [python]
// Python loads the operator's library and trains kPythonSteps steps with it from tensors it made
// (train_with_op.py); C++ trains from what Python started with, on Python's order, and compares.
// Returns the largest relative difference of the losses and of the parameters.
std::pair<double, double> python_difference(const DeviceSet& data, const std::string& data_dir,
                                            const torch::Device& device) {
  course::TemporaryFolder folder("lesson23-python-");
  const std::vector<std::string> argv = {python(),     python_script(),
                                         "--library",  epoch_op::library_path(),
                                         "--steps",    std::to_string(kPythonSteps),
                                         "--limit",    std::to_string(data.labels.size(0)),
                                         "--device",   device.is_cuda() ? "cuda" : "cpu",
                                         "--threads",  std::to_string(at::get_num_threads()),
                                         "--data-dir", data_dir,
                                         "--save",     folder.file("python.pt")};
  std::cout << "  $";
  for (const auto& a : argv) std::cout << " " << a;
  std::cout << std::endl;
  course::ChildProcess child(argv, {"PYTHONUNBUFFERED=1"}, /*with_stderr=*/true);
  for (std::string line; child.read_line(line);) std::cout << "  python> " << line << std::endl;
  const auto status = child.wait_for(std::chrono::minutes(5));
  if (!status || *status != 0)
    throw course::CourseError("Python could not train with the operator (" +
                                  (status ? course::describe_status(*status) : "still running") +
                                  ")",
                              "its lines are above; run its command by hand to see more");
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [name, tensor] : course::read_python_state_dict(folder.file("python.pt")))
    saved[name] = tensor.to(device);
  OpTrainer op = make_op_trainer(device, kSeed);
  op.flat.values.copy_(saved.at("start"));
  const torch::Tensor losses = train_with_op(op, data.images, data.labels, saved.at("order"));
  return {relative_difference(losses, saved.at("losses")),
          course::max_rel_diff(op.flat.values, saved.at("parameters"))};
}
//! [python]

// ---- the lesson (5. what an epoch costs: epoch_floors.h) ----------------------------------------
void run_lesson(const course::ImageSet& train, const course::ImageSet& test, int epochs,
                int check_steps, double bar, const std::string& data_dir,
                const torch::Device& device, course::Verdict& verdict) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(epoch_op::kName, "");
  std::printf(
      "\n1. the operator, found by name in %s\n  %s\n  implementations: CPU %s, CUDA %s\n",
      epoch_op::library_path().c_str(), c10::toString(op.schema()).c_str(),
      op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ? "yes" : "no",
      op.hasKernelForDispatchKey(c10::DispatchKey::CUDA) ? "yes" : "no (a LibTorch without CUDA)");
  const DeviceSet data = to_device(train, device);
  std::printf("\n2. checked on %s, %d steps on the same batches\n", device.str().c_str(),
              check_steps);
  check_operator(data, check_steps, device, verdict);

  std::printf(
      "\n3. trained, %d epoch(s), each form from the seed: the same first weights and "
      "the same orders\n",
      epochs);
  const std::int64_t samples = train.labels.size(0);
  Trainer reference = make_trainer(device, kSeed);
  const auto with_autograd = [&](const torch::Tensor& order) {
    return train_with_autograd(reference, data.images, data.labels, order);
  };
  const auto tutorial_epochs = course::run_epochs(
      "autograd", epochs, samples, [&] { return epoch_of(data, device, with_autograd); },
      "nothing is saved");
  OpTrainer op_trainer = make_op_trainer(device, kSeed);
  const auto with_op = [&](const torch::Tensor& order) {
    return train_with_op(op_trainer, data.images, data.labels, order);
  };
  const auto op_epochs = course::run_epochs(
      "operator", epochs, samples, [&] { return epoch_of(data, device, with_op); },
      "nothing is saved");
  const double accuracy = course::test_accuracy(op_trainer.model, test, device);
  const double tutorial_accuracy = course::test_accuracy(reference.model, test, device);
  const course::Timing op_timing = course::epoch_timing(op_epochs);
  course::print_timed_runs({{"autograd", course::epoch_timing(tutorial_epochs),
                             static_cast<double>(samples), tutorial_accuracy},
                            {"operator", op_timing, static_cast<double>(samples), accuracy}},
                           "ms/epoch", "samples/s", "test accuracy", device.str());

  std::printf("\n4. the same operator from Python\n");
  if (const std::string why = why_no_python(); !why.empty()) {
    std::printf("  (skipped: %s)\n", why.c_str());
  } else {
    const auto [losses, parameters] = python_difference(data, data_dir, device);
    verdict.check(losses <= kStepTolerance && parameters <= kStepTolerance,
                  "Python's call gives C++'s losses and parameters",
                  course::format("largest relative differences %.2e and %.2e over %d steps "
                                 "(tolerance %.0e)",
                                 losses, parameters, kPythonSteps, kStepTolerance));
  }

  const double steps = static_cast<double>(steps_for(samples));
  const double flops = course::kTrainingFlopsPerSample * static_cast<double>(samples);
  const double rate = course::matmul_rate(device);
  std::printf(
      "\n5. what an epoch costs\n  %.1f us per step (%.0f steps, the median epoch)\n"
      "  compute floor: %.1f GFLOP per epoch at %.0f GFLOP/s (a 1024x1024 product on %s) "
      "= %.1f ms per epoch; the operator took %.1fx it\n",
      op_timing.median_s / steps * 1e6, steps, flops / 1e9, rate / 1e9, device.str().c_str(),
      flops / rate * 1e3, op_timing.median_s / (flops / rate));
  // One more epoch, with the operator's clock: where a step's time goes.
  torch::Tensor clock = torch::empty({epoch_kernel::kGridSyncsPerStep * steps_for(samples) + 1},
                                     torch::dtype(torch::kLong).device(device));
  train_with_op(op_trainer, data.images, data.labels,
                torch::randperm(samples, torch::dtype(torch::kLong).device(device)), clock);
  const std::vector<double> phase = phase_medians_us(clock);
  std::printf(
      "  a step, phase by phase (medians of one more epoch's steps; on a GPU each phase with "
      "the barrier that ends it): the first layer %.1f us, the rows %.1f us, the parameters "
      "%.1f us\n",
      phase[0], phase[1], phase[2]);
  if (!device.is_cuda()) {
    std::printf("  kernels per epoch and grid barriers: (skipped: needs CUDA)\n");
  } else {
    print_gpu_floors([&] { epoch_of(data, device, with_op); }, device, steps, kSyncsTimed);
    std::printf(
        "  the epoch: %.1f ms; the course's goal, about 10 us a step: %.0f ms; lesson "
        "21's, which its graphed epoch missed on an H200: %.0f ms\n",
        op_timing.median_s * 1e3, kGoalEpochMs, kLesson21GoalMs);
  }
  verdict.check(accuracy >= bar, "operator run: test accuracy reaches the bar",
                course::format("%.4f vs bar %.2f", accuracy, bar));
  verdict.check(tutorial_accuracy >= bar, "tutorial run: test accuracy reaches the bar",
                course::format("%.4f vs bar %.2f", tutorial_accuracy, bar));
}

}  // namespace lesson23

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson23.cpp includes this file
int main(int argc, char** argv) try {
  using namespace lesson23;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  course::Cli cli("lesson23_custom_kernel",
                  "Lesson 23: the tutorial's epoch in one CUDA kernel of our own, as an operator.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  const bool full_run = !options.quick && epochs >= kEpochs;  // kAccuracyBar is for a full run
  std::cout << "Fashion-MNIST: " << train.labels.size(0) << " training images, "
            << test.labels.size(0) << " test; the tutorial's ANN\n";
  run_lesson(train, test, epochs, options.quick ? kQuickCheckSteps : kCheckSteps,
             full_run ? kAccuracyBar : kQuickAccuracyBar, folder.string(), device, verdict);
  return verdict.finish("lesson 23 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
