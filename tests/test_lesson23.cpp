// Tests of lesson 23: the operator gpu_lessons::train_epoch registered and found by name, its CPU
// implementation against autograd and the tutorial's step, its refusals of wrong inputs, Python's
// call of it against C++'s, and (on a GPU) the CUDA kernel against the CPU implementation, with
// the lesson's own functions and constants.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/compare.h"
#include "cuda_test.h"
#ifdef GPU_LESSONS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>   // defines: CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>  // defines: getStreamFromPool, getCurrentCUDAStream
#endif
#include "custom_kernel.cpp"
#include "fashion_mnist_test.h"

namespace {

// `samples` random images (rows of 784) and labels, on `device`.
lesson23::DeviceSet random_set(std::int64_t samples, const torch::Device& device) {
  torch::manual_seed(3);
  return {torch::rand({samples, 784}).to(device),
          torch::randint(10, {samples}, torch::kLong).to(device)};
}

// The first `samples` rows of a permutation of `set`, drawn from a fixed seed, on its device.
torch::Tensor order_of(const lesson23::DeviceSet& set, std::int64_t samples) {
  torch::manual_seed(8);
  return torch::randperm(set.labels.size(0), torch::kLong)
      .narrow(0, 0, samples)
      .to(set.images.device());
}

}  // namespace

// Tests that the library registered the operator under the course's namespace with its schema,
// that C++ finds it by name, and which devices it has an implementation for.
TEST(Operator, IsFoundByNameWithItsSchema) {
  const auto op = c10::Dispatcher::singleton().findSchema({epoch_op::kName, ""});
  ASSERT_TRUE(op.has_value()) << "no " << epoch_op::kName;
  const std::string schema = c10::toString(op->schema());
  EXPECT_NE(schema.find("gpu_lessons::train_epoch(Tensor(a!) parameters, Tensor(b!) gradients"),
            std::string::npos)
      << schema;
  EXPECT_NE(schema.find("int batch_size, float lr, Tensor(f!)? clock=None) -> Tensor"),
            std::string::npos)
      << schema;
  EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CPU));
#ifdef GPU_LESSONS_WITH_CUDA
  EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
#else
  EXPECT_FALSE(op->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
#endif
  EXPECT_NE(epoch_op::library_path().find("libgpu_lessons_ops.so"), std::string::npos)
      << epoch_op::library_path();
}

// Tests that one step of the operator gives autograd's loss and gradients, on a batch of 64 and
// on a smaller last batch.
TEST(Operator, OneStepGivesAutogradsLossAndGradients) {
  const lesson23::DeviceSet set = random_set(100, torch::kCPU);
  for (const std::int64_t rows : {std::int64_t{64}, std::int64_t{22}, std::int64_t{1}})
    EXPECT_LE(lesson23::one_step_difference(set, rows, torch::kCPU), lesson23::kGradientTolerance)
        << rows << " rows";
}

// Tests that the operator trains as the tutorial's step on the same batches (the last smaller),
// within the lesson's tolerance.
TEST(Operator, TrainsAsTheTutorialsStep) {
  const lesson23::DeviceSet set = random_set(1000, torch::kCPU);
  const torch::Tensor order = order_of(set, 10 * 64 + 30);
  lesson23::OpTrainer op = lesson23::make_op_trainer(torch::kCPU, 1);
  lesson23::Trainer reference = lesson23::make_trainer(torch::kCPU, 1);
  const torch::Tensor got = lesson23::train_with_op(op, set.images, set.labels, order);
  const torch::Tensor expected =
      lesson23::train_with_autograd(reference, set.images, set.labels, order);
  ASSERT_EQ(got.size(0), 11);
  EXPECT_LE(lesson23::relative_difference(got, expected), lesson23::kStepTolerance);
  std::vector<torch::Tensor> parameters;  // autograd's, in the flat tensor's order
  for (const auto& p : reference.model->parameters()) parameters.push_back(p.detach().flatten());
  EXPECT_LE(course::max_rel_diff(op.flat.values, torch::cat(parameters)), lesson23::kStepTolerance);
}

// Tests that the operator returns a loss per step and advances Adam's step count by its steps,
// call after call, as its schema says.
TEST(Operator, ReturnsEachStepsLossAndAdvancesAdamsStep) {
  const lesson23::DeviceSet set = random_set(200, torch::kCPU);
  lesson23::OpTrainer op = lesson23::make_op_trainer(torch::kCPU, 1);
  const torch::Tensor order = order_of(set, 150);  // 64 + 64 + 22
  EXPECT_EQ(lesson23::train_with_op(op, set.images, set.labels, order).size(0), 3);
  EXPECT_EQ(op.step.item<double>(), 3);
  lesson23::train_with_op(op, set.images, set.labels, order);
  EXPECT_EQ(op.step.item<double>(), 6);
}

// One call's arguments, each replaceable by a wrong one.
struct Call {
  lesson23::OpTrainer t = lesson23::make_op_trainer(torch::kCPU, 1);
  torch::Tensor images, labels, order;
  std::int64_t batch = lesson23::kBatchSize;
  double lr = lesson23::kLearningRate;
  c10::optional<torch::Tensor> clock;
  torch::Tensor run() {
    return lesson23::train_epoch_op().call(t.flat.values, t.flat.gradients, t.exp_avg, t.exp_avg_sq,
                                           t.step, images, labels, order, batch, lr, clock);
  }
};

// Tests that each wrong input is refused with a message naming it, before anything is changed.
TEST(Operator, RefusesWrongInputsNamingThem) {
  const lesson23::DeviceSet set = random_set(100, torch::kCPU);
  const torch::Tensor order = order_of(set, 64);
  const std::vector<std::tuple<const char*, const char*, std::function<void(Call&)>>> cases = {
      {"int32 labels", "labels must be int64",
       [](Call& c) { c.labels = c.labels.to(torch::kInt); }},
      {"images as [N, 28, 28]", "images must be float32 [N, 784]",
       [](Call& c) {
         c.images = c.images.view({-1, 28, 28});
       }},
      {"images not contiguous", "images must be contiguous",
       [](Call& c) { c.images = c.images.t().contiguous().t(); }},
      {"another model's parameters", "parameters must be float32 [109386]",
       [](Call& c) { c.t.flat.values = torch::zeros({10}); }},
      {"Adam's step as int64", "step must be one float32",
       [](Call& c) { c.t.step = torch::zeros({}, torch::kLong); }},
      {"no samples", "order must be int64 [samples]",
       [](Call& c) { c.order = c.order.narrow(0, 0, 0); }},
      {"a sample past the images", "order holds",
       [](Call& c) { c.order = c.order.clone().fill_(100); }},
      {"a label past the classes", "labels must be classes 0..9",
       [](Call& c) { c.labels = c.labels.clone().fill_(10); }},
      {"a batch of 0", "batch_size must be 1..64", [](Call& c) { c.batch = 0; }},
      {"a batch of 65", "batch_size must be 1..64", [](Call& c) { c.batch = 65; }},
      {"a negative learning rate", "lr must be a positive number", [](Call& c) { c.lr = -1e-3; }},
      {"one tensor as both of Adam's moments", "exp_avg and exp_avg_sq share memory",
       [](Call& c) { c.t.exp_avg_sq = c.t.exp_avg; }},
      {"the gradients inside the parameters", "parameters and gradients share memory",
       [](Call& c) { c.t.flat.gradients = c.t.flat.values; }},
      {"a clock of the wrong size", "clock must be contiguous int64 [4]",
       [](Call& c) { c.clock = torch::zeros({3}, torch::kLong); }},
  };
  for (const auto& [wrong, says, make] : cases) {
    Call c;
    c.images = set.images, c.labels = set.labels, c.order = order;
    make(c);
    const torch::Tensor before = c.t.flat.values.clone();
    try {
      c.run();
      ADD_FAILURE() << wrong << ": taken";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(says), std::string::npos)
          << wrong << ": " << e.what_without_backtrace();
    }
    EXPECT_TRUE(torch::equal(before, c.t.flat.values)) << wrong << ": the parameters changed";
  }
}

// Tests that parameters which require grad are refused where the operator writes in place
// (autograd's fallback: the operator has no backward), with autograd's own message.
TEST(Operator, RefusesALeafThatRequiresGrad) {
  const lesson23::DeviceSet set = random_set(100, torch::kCPU);
  Call c;
  c.images = set.images, c.labels = set.labels, c.order = order_of(set, 64);
  c.t.flat.values.requires_grad_(true);
  try {
    c.run();
    ADD_FAILURE() << "taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("in-place operation"), std::string::npos)
        << e.what_without_backtrace();
  }
}

// Tests the steps of an epoch: the tutorial's 938 for 60,000 images, the last one smaller.
TEST(Operator, StepsOfAnEpoch) {
  EXPECT_EQ(lesson23::steps_for(60000), 938);
  EXPECT_EQ(lesson23::steps_for(64), 1);
  EXPECT_EQ(lesson23::steps_for(65), 2);
}

// Tests the operator's clock on the CPU: the start, then the end of each phase of each step, each
// no earlier than the one before.
TEST(Operator, ClockGetsEachPhasesTime) {
  const lesson23::DeviceSet set = random_set(200, torch::kCPU);
  Call c;
  c.images = set.images, c.labels = set.labels, c.order = order_of(set, 150);  // 3 steps
  c.clock = torch::zeros({3 * 3 + 1}, torch::kLong);
  c.run();
  const torch::Tensor& clock = *c.clock;
  EXPECT_GT(clock[0].item<std::int64_t>(), 0);
  EXPECT_TRUE((clock.narrow(0, 1, 9) >= clock.narrow(0, 0, 9)).all().item<bool>()) << clock;
  EXPECT_EQ(lesson23::phase_medians_us(clock).size(), 3u);
}

// Tests the lesson's Python part on the real data: Python loads the operator's library, trains
// with torch.ops.gpu_lessons.train_epoch on tensors it made, and C++, from the same start and
// order, gets the same losses and parameters.
class OperatorFromPython : public FashionMnistTest {};
TEST_F(OperatorFromPython, GivesWhatCppGets) {
  if (const std::string why = lesson23::why_no_python(); !why.empty()) GTEST_SKIP() << why;
  const lesson23::DeviceSet data = lesson23::to_device(course::take(train(), 10000), torch::kCPU);
  const auto [losses, parameters] =
      lesson23::python_difference(data, course::find_fashion_mnist("").string(), torch::kCPU);
  EXPECT_LE(losses, lesson23::kStepTolerance);
  EXPECT_LE(parameters, lesson23::kStepTolerance);
}

// Tests the CUDA kernel, on a GPU: one step's loss and gradients are autograd's (batches of 64,
// 22 and 1), and 100 steps train as the CPU implementation from the same start on the same
// batches (their losses, step by step: lesson 21's check).
class OperatorOnCuda : public CudaTest {};
TEST_F(OperatorOnCuda, OneStepGivesAutogradsLossAndGradients) {
  const lesson23::DeviceSet set = random_set(100, device);
  for (const std::int64_t rows : {std::int64_t{64}, std::int64_t{22}, std::int64_t{1}})
    EXPECT_LE(lesson23::one_step_difference(set, rows, device), lesson23::kGradientTolerance)
        << rows << " rows";
}

TEST_F(OperatorOnCuda, KernelTrainsAsTheCpuImplementation) {
  const lesson23::DeviceSet set = random_set(10000, device);
  const torch::Tensor order = order_of(set, 100 * 64 - 10);
  lesson23::OpTrainer on_gpu = lesson23::make_op_trainer(device, 1);
  lesson23::OpTrainer on_cpu = lesson23::make_op_trainer(torch::kCPU, 1);
  const torch::Tensor got = lesson23::train_with_op(on_gpu, set.images, set.labels, order);
  const torch::Tensor expected =
      lesson23::train_with_op(on_cpu, set.images.cpu(), set.labels.cpu(), order.cpu());
  EXPECT_LE(lesson23::relative_difference(got.cpu(), expected), lesson23::kStepTolerance);
  EXPECT_EQ(on_gpu.step.item<double>(), 100);
}

#ifdef GPU_LESSONS_WITH_CUDA  // (the stream's API is in a CUDA LibTorch only)
// Tests that the kernel gives the same results twice (it sums in a fixed order: no atomics), and
// on a stream of the caller's as on the default one (it runs on LibTorch's current stream).
TEST_F(OperatorOnCuda, KernelIsDeterministicOnAnyStream) {
  const lesson23::DeviceSet set = random_set(1000, device);
  const torch::Tensor order = order_of(set, 10 * 64 + 7);
  lesson23::OpTrainer first = lesson23::make_op_trainer(device, 1);
  lesson23::OpTrainer second = lesson23::make_op_trainer(device, 1);
  const torch::Tensor losses = lesson23::train_with_op(first, set.images, set.labels, order);
  torch::Tensor again;
  {
    c10::cuda::CUDAStreamGuard on_side_stream(c10::cuda::getStreamFromPool(false, device.index()));
    again = lesson23::train_with_op(second, set.images, set.labels, order);
    c10::cuda::getCurrentCUDAStream().synchronize();
  }
  EXPECT_TRUE(torch::equal(losses, again));
  EXPECT_TRUE(torch::equal(first.flat.values, second.flat.values));
  // The clock on the GPU: a time for the start and after each barrier, in order.
  torch::Tensor clock = torch::zeros({3 * 11 + 1}, torch::dtype(torch::kLong).device(device));
  lesson23::train_with_op(first, set.images, set.labels, order, clock);
  const torch::Tensor times = clock.cpu();
  EXPECT_TRUE((times.narrow(0, 1, 33) >= times.narrow(0, 0, 33)).all().item<bool>()) << times;
  EXPECT_GT(times[0].item<std::int64_t>(), 0);
}
#endif

// Tests that tensors on two devices are refused, naming them, before the kernel is launched.
TEST_F(OperatorOnCuda, RefusesTensorsOnTwoDevices) {
  const lesson23::DeviceSet set = random_set(100, torch::kCPU);
  lesson23::OpTrainer t = lesson23::make_op_trainer(device, 1);
  try {
    lesson23::train_with_op(t, set.images, set.labels, order_of(set, 64));
    ADD_FAILURE() << "taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("every tensor must be on one device"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}
