// Tests of lesson 07: step memory against batch size, freeing and emptying, the OOM loop.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "memory/memory.h"
#include "memory_management.cpp"
#include "smi_view.h"
#include "training_state.h"

namespace {

struct TrainingRig {
  lesson07::Net model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  explicit TrainingRig(const torch::Device& device) {
    course::install_counting_cpu_allocator();
    torch::manual_seed(lesson07::kSeed);
    model->to(device);
    optimizer =
        std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
    lesson07::train_step(model, *optimizer, 8, device);
  }
};

// Removes the CPU budget however the test ends.
struct BudgetGuard {
  explicit BudgetGuard(std::int64_t bytes) { course::set_cpu_memory_budget(bytes); }
  ~BudgetGuard() { course::set_cpu_memory_budget(0); }
};

void expect_step_memory_grows(const torch::Device& device) {
  TrainingRig s(device);
  const auto small = lesson07::measure_step(s.model, *s.optimizer, 256, device);
  const auto large = lesson07::measure_step(s.model, *s.optimizer, 2048, device);
  EXPECT_GT(large.peak, small.peak);
  EXPECT_GT(large.activations, 4 * small.activations);
  // Kept for backward, per sample: at least the two hidden layers' activations (2 x 1024 floats).
  EXPECT_GE(large.bytes_per_sample(), 2 * lesson07::kHidden * 4);
  EXPECT_NEAR(large.bytes_per_sample(), small.bytes_per_sample(), 0.25 * small.bytes_per_sample());
}

}  // namespace

// Tests that the peak of a step and the activations it keeps grow with the batch (CPU).
TEST(StepMemory, GrowsWithBatchOnCpu) { expect_step_memory_grows(torch::kCPU); }

// Tests the state's bytes: parameters, gradients and Adam's two moments, four copies of every
// parameter, which is what the counting allocator holds after the first step on the CPU.
TEST(StateBytes, FourCopiesOfTheParameters) {
  course::install_counting_cpu_allocator();
  const std::int64_t before = course::memory_stats(torch::kCPU).allocated;
  TrainingRig s(torch::kCPU);
  std::int64_t parameters = 0;
  for (const auto& p : s.model->parameters()) parameters += p.nbytes();
  EXPECT_EQ(lesson07::training_state_bytes(*s.model, *s.optimizer), 4 * parameters);
  EXPECT_EQ(course::memory_stats(torch::kCPU).allocated - before, 4 * parameters);
}

// Tests the state's bytes tensor by tensor: parameters, then their gradients, then Adam's two
// moments.
TEST(StateBytes, ParametersGradientsAndAdamsMoments) {
  torch::nn::Linear model(3, 2);  // 8 floats: 32 bytes
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  EXPECT_EQ(lesson07::training_state_bytes(*model, adam), 32);
  model->forward(torch::ones({1, 3})).sum().backward();
  EXPECT_EQ(lesson07::training_state_bytes(*model, adam), 64);
  adam.step();
  EXPECT_EQ(lesson07::training_state_bytes(*model, adam), 128);
}

// Tests that the driver's view is empty on the CPU (no driver to ask).
TEST(MemGetInfo, ZerosOnTheCpu) {
  const lesson07::MemGetInfo cpu = lesson07::mem_get_info(torch::kCPU);
  EXPECT_EQ(cpu.free, 0);
  EXPECT_EQ(cpu.total, 0);
}

// Tests the tutorial's tips on the CPU: the deleted tensor's bytes come back, and the CPU keeps
// no cache (reserved is allocated, before and after empty_cache).
TEST(FreeThenEmpty, ReturnsToBaselineOnCpu) {
  course::install_counting_cpu_allocator();
  const auto f = lesson07::free_then_empty(torch::kCPU, 64 << 20);
  EXPECT_GE(f.allocated_with - f.allocated_before, 64 << 20);
  EXPECT_EQ(f.allocated_after, f.allocated_before);
  EXPECT_EQ(f.reserved_after_free, f.allocated_after);
  EXPECT_EQ(f.reserved_after_empty, f.allocated_after);
}

// Tests the OOM loop against a CPU budget: it fails, halves, and ends on a batch that fits.
TEST(OomLoop, RecoversUnderCpuBudget) {
  TrainingRig s(torch::kCPU);
  BudgetGuard budget(course::memory_stats(torch::kCPU).allocated + (64 << 20));
  const auto attempts = lesson07::shrink_until_fits(s.model, *s.optimizer, 65536, torch::kCPU);
  ASSERT_GE(attempts.size(), 2u);
  EXPECT_FALSE(attempts.front().fit);
  EXPECT_NE(attempts.front().error.find("budget"), std::string::npos) << attempts.front().error;
  EXPECT_TRUE(attempts.back().fit);
  for (size_t i = 1; i < attempts.size(); ++i) {
    EXPECT_EQ(attempts[i].batch, attempts[i - 1].batch / 2);
  }
}

// Tests the same on the GPU, with the caching allocator's cache and a real out-of-memory error.
TEST_F(CudaTest, MemoryFactsOnGpu) {
  expect_step_memory_grows(device);
  const auto f = lesson07::free_then_empty(device, 256 << 20);
  EXPECT_EQ(f.allocated_after, f.allocated_before);
  EXPECT_GE(f.reserved_after_free, f.allocated_before + (256 << 20));  // the cache keeps it
  EXPECT_LT(f.reserved_after_empty, f.reserved_after_free);
  const lesson07::MemGetInfo driver = lesson07::mem_get_info(device);  // the whole GPU's
  EXPECT_GT(driver.free, 0);
  EXPECT_LE(driver.free, driver.total);
  TrainingRig s(device);
  // Beyond the state, allocated holds cuBLAS's workspaces, nothing else: at most a few each.
  const std::int64_t state = lesson07::training_state_bytes(*s.model, *s.optimizer);
  const std::int64_t allocated = course::memory_stats(device).allocated;
  EXPECT_GE(allocated, state);
  EXPECT_LE(allocated - state, 4 * static_cast<std::int64_t>(64 << 20)) << allocated - state;
  const auto step = lesson07::measure_step(s.model, *s.optimizer, 1024, device);
  std::int64_t start = 1;
  while (start * step.bytes_per_sample() < 2.0 * lesson07::mem_get_info(device).total) start *= 2;
  const auto attempts = lesson07::shrink_until_fits(s.model, *s.optimizer, start, device);
  ASSERT_GE(attempts.size(), 2u);
  EXPECT_FALSE(attempts.front().fit);
  EXPECT_TRUE(attempts.back().fit);
}

// Tests --watch's view on a GPU: a line each period while work runs, each with the driver's used
// and total memory.
TEST_F(CudaTest, WatchPrintsTheDriversViewEachPeriod) {
  std::ostringstream out;
  {
    const lesson07::SmiWatch watch(device, std::chrono::milliseconds(100), out);
    const torch::Tensor x = torch::randn({2048, 2048}, torch::TensorOptions().device(device));
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(550);
    while (std::chrono::steady_clock::now() < end) (void)x.mm(x);
  }
  const std::string text = out.str();
  if (text.find("nothing to watch") != std::string::npos) GTEST_SKIP() << text;  // no NVML
  EXPECT_GE(std::count(text.begin(), text.end(), '\n'), 4) << text;
  EXPECT_NE(text.find("[nvidia-smi "), std::string::npos) << text;
  EXPECT_NE(text.find(" used of "), std::string::npos) << text;
}

// Tests the lesson's nvidia-smi part on a GPU: NVML (the driver's library) is found, and lists this
// process with at least the memory its allocator has reserved (nvidia-smi adds the CUDA context).
TEST_F(CudaTest, NvidiaSmiListsThisProcess) {
  const torch::Tensor held = torch::empty({64 << 20}, torch::TensorOptions().device(device));
  torch::cuda::synchronize(device.index());
  const std::int64_t reserved = lesson07::read_memory(device).reserved;
  const lesson07::SmiView smi = lesson07::smi_view(device);
  ASSERT_TRUE(smi.available) << smi.why_not;
  EXPECT_GT(smi.total, 0);
  EXPECT_GE(smi.used, reserved);
  const lesson07::GpuProcess* self = nullptr;
  for (const auto& p : smi.processes) {
    if (p.pid == static_cast<unsigned>(getpid())) self = &p;
  }
  if (self == nullptr) {
    GTEST_SKIP() << "this process (pid " << getpid() << ") is not among NVML's "
                 << smi.processes.size() << " processes: in a container NVML lists the host's "
                 << "process IDs";
  }
  ASSERT_GE(self->bytes, 0) << "the driver did not report this process's memory";
  EXPECT_GE(self->bytes, reserved);
}
