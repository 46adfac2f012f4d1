// Tests of lesson 01: what it reports about the build, how --device resolves, and the probe.
#include <gtest/gtest.h>

#include <algorithm>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/device.h"
#include "cuda_test.h"
#include "device_check.cpp"

// Tests the tutorials' device check: the GPU exactly when CUDA is available, the device that
// --device auto picks, and the tutorial's tensor moved there.
TEST(Tutorial, ChoosesTheDeviceAutoPicks) {
  const torch::Device device = lesson01::choose_device();
  EXPECT_EQ(device.is_cuda(), torch::cuda::is_available());
  EXPECT_EQ(device.type(), course::resolve_device("auto").device.type());
  const torch::Tensor tensor = lesson01::first_tensor(device);
  EXPECT_EQ(tensor.device().type(), device.type());
  EXPECT_EQ(tensor.sizes(), torch::IntArrayRef({5, 5}));
}

// Tests tutorial 004's three-way choice: CUDA where it is available, else MPS where LibTorch has it
// and says it is available (never on Linux), else the CPU.
TEST(Tutorial, ThreeWayChoiceCudaMpsCpu) {
  const torch::Device device = lesson01::choose_device_cuda_mps_cpu();
  if (torch::cuda::is_available()) {
    EXPECT_TRUE(device.is_cuda());
  } else {
    EXPECT_TRUE(device.is_cpu()) << device;  // a Linux machine has no MPS
  }
}

// Tests that the first tensor goes to the device it is given (the meta device stands in for a
// GPU on a machine without one).
TEST(Tutorial, FirstTensorMoves) {
  EXPECT_TRUE(lesson01::first_tensor(torch::Device(torch::kMeta)).is_meta());
}

// Tests that the build facts agree with each other and with the GPU list.
TEST(BuildInfo, FactsAreConsistent) {
  const auto info = lesson01::build_info();
  EXPECT_EQ(info.torch_version.rfind(std::to_string(TORCH_VERSION_MAJOR) + ".", 0), 0u);
  EXPECT_EQ(info.gpu_count, static_cast<int>(course::list_gpus().size()));
  if (info.cuda_available) {
    EXPECT_TRUE(info.cuda_compiled);
  }
  EXPECT_EQ(info.cuda_available, info.gpu_count > 0);
}

// Tests the table of --device strings the lesson prints: cpu and auto always run, banana never,
// and a GPU index is accepted exactly when that GPU exists.
TEST(ResolveExamples, MatchTheMachine) {
  const auto rows = lesson01::resolve_examples();
  auto find = [&rows](const std::string& spec) {
    return *std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.spec == spec; });
  };
  EXPECT_TRUE(find("cpu").accepted);
  EXPECT_EQ(find("cpu").outcome, "cpu");
  EXPECT_TRUE(find("auto").accepted);
  EXPECT_FALSE(find("banana").accepted);
  EXPECT_NE(find("banana").outcome.find("exit 2"), std::string::npos);
  const int gpus = course::cuda_device_count();
  EXPECT_EQ(find("cuda:0").accepted, gpus >= 1);
  EXPECT_EQ(find("cuda:1").accepted, gpus >= 2);
  if (gpus == 0) {
    EXPECT_NE(find("auto").outcome.find("fallback"), std::string::npos);
  }
}

// Tests that the probe on the CPU matches its own reference exactly enough.
TEST(Probe, CpuMatches) {
  EXPECT_LE(lesson01::probe_device(torch::kCPU, lesson01::kSeed), lesson01::kProbeTolerance);
}

// Tests that the probe on the GPU matches the CPU within the lesson's tolerance.
TEST_F(CudaTest, ProbeMatchesCpu) {
  EXPECT_LE(lesson01::probe_device(device, lesson01::kSeed), lesson01::kProbeTolerance);
  const auto gpus = course::list_gpus();
  ASSERT_FALSE(gpus.empty());
  EXPECT_FALSE(gpus[0].name.empty());
  EXPECT_EQ(lesson01::get_device_name(0), gpus[0].name);  // torch.cuda.get_device_name(0)
  EXPECT_GT(gpus[0].total_bytes, 0);
  EXPECT_GE(gpus[0].major, 3);
}
