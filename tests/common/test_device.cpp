// Tests of common/device.h: device choice (--device, the CPU fallback and its reason), the device
// line, byte counts; and the CPU threads and quotas that common/cli.h sets and reads. (The command
// line itself is checked on every program: tests/CMakeLists.txt's cli tests.)

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/device.h"
#include "common/temporary_folder.h"
#include "common/verdict.h"
// Tests that cpu always resolves to the CPU without a fallback note.
TEST(ResolveDevice, CpuIsCpu) {
  const auto choice = course::resolve_device("cpu");
  EXPECT_TRUE(choice.device.is_cpu());
  EXPECT_TRUE(choice.fallback.empty());
}

// Tests that auto and cuda pick cuda:0 with a GPU, else the CPU with a stated reason.
TEST(ResolveDevice, AutoAndCudaFallBackWithReason) {
  for (const std::string spec : {"auto", "cuda"}) {
    const auto choice = course::resolve_device(spec);
    if (course::cuda_device_count() > 0) {
      EXPECT_EQ(choice.device, c10::Device(c10::kCUDA, 0)) << spec;
      EXPECT_TRUE(choice.fallback.empty()) << spec;
    } else {
      EXPECT_TRUE(choice.device.is_cpu()) << spec;
      EXPECT_EQ(choice.fallback, course::why_no_cuda()) << spec;
    }
  }
}

// Tests that unknown strings are usage errors naming the accepted forms.
TEST(ResolveDevice, UnknownStringIsUsageError) {
  for (const std::string spec : {"banana", "CUDA", "cuda:", "cuda:-1", "cuda:x", "meta", ""}) {
    try {
      course::resolve_device(spec);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const course::UsageError& error) {
      EXPECT_NE(error.hint().find("auto, cpu, cuda, cuda:N"), std::string::npos) << spec;
    }
  }
}

// Tests that a GPU index past the GPU count is a usage error, and one within it is accepted.
TEST(ResolveDevice, IndexPastCountIsUsageError) {
  const int count = course::cuda_device_count();
  EXPECT_THROW(course::resolve_device("cuda:" + std::to_string(count)), course::UsageError);
  EXPECT_THROW(course::resolve_device("cuda:99"), course::UsageError);
  if (count > 0) {
    EXPECT_EQ(course::resolve_device("cuda:" + std::to_string(count - 1)).device.index(),
              count - 1);
  }
}

// Tests the device description names the CPU threads.
TEST(Describe, CpuNamesThreads) {
  EXPECT_EQ(course::describe(c10::Device(c10::kCPU)).rfind("cpu (", 0), 0u);
}

// Tests start_lesson with the lesson's own device: --device auto keeps it (a GPU as cuda:0) and
// prints it first; another --device overrides it, a bad one is a usage error.
TEST(StartLesson, AutoKeepsTheLessonsChoiceAndDeviceOverridesIt) {
  const int threads = at::get_num_threads();
  const torch::Device tutorials(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  course::CommonOptions options;
  testing::internal::CaptureStdout();
  const c10::Device kept = course::start_lesson(options, tutorials);
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_EQ(kept.type(), tutorials.type());
  if (kept.is_cuda()) EXPECT_EQ(kept.index(), 0);
  EXPECT_EQ(printed.rfind("Device: " + kept.str(), 0), 0u) << printed;
  options.device = "cpu";
  testing::internal::CaptureStdout();
  EXPECT_TRUE(course::start_lesson(options, torch::Device(torch::kCUDA)).is_cpu());
  testing::internal::GetCapturedStdout();
  options.device = "cuda:99";
  EXPECT_THROW(course::start_lesson(options, tutorials), course::UsageError);
  at::set_num_threads(threads);
}

// Tests that CpuThreads sets the thread count for its scope only, and that 0 leaves it alone.
TEST(CpuThreads, SetsForAScopeAndRestores) {
  const int before = at::get_num_threads();
  const int other = before == 1 ? 2 : 1;
  {
    const course::CpuThreads scoped(other);
    EXPECT_EQ(at::get_num_threads(), other);
    const course::CpuThreads unchanged(0);
    EXPECT_EQ(at::get_num_threads(), other);
  }
  EXPECT_EQ(at::get_num_threads(), before);
}

// A cgroup tree under a temporary folder: each (folder, file, text) a file in it, and `self` (when
// not empty) what /proc/self/cgroup would say; returns that file's path.
std::string cgroup_tree(const course::TemporaryFolder& root, const std::string& self,
                        const std::vector<std::array<std::string, 3>>& files) {
  for (const auto& [folder, file, text] : files) {
    std::filesystem::create_directories(root.path() / folder);
    std::ofstream(root.file(folder + "/" + file)) << text << "\n";
  }
  if (!self.empty()) std::ofstream(root.file("self")) << self;
  return root.file("self");
}

// Tests that a cgroup v2 quota is read in this process's cgroup and the ones above it, the
// smallest taken and rounded up to whole cores; "max" is no quota.
TEST(CpuQuota, CgroupV2SmallestUpTheTree) {
  course::TemporaryFolder root("cgroup-v2-");
  const std::string self =
      cgroup_tree(root, "0::/box/job\n",
                  {{"box", "cpu.max", "250000 100000"}, {"box/job", "cpu.max", "max 100000"}});
  EXPECT_EQ(course::cpu_quota_cores(root.path().string(), self), 3);  // 2.5 cores: 3 threads
  cgroup_tree(root, "", {{"box/job", "cpu.max", "150000 100000"}});
  EXPECT_EQ(course::cpu_quota_cores(root.path().string(), self), 2);
  cgroup_tree(root, "", {{"box", "cpu.max", "max 100000"}, {"box/job", "cpu.max", "max 100000"}});
  EXPECT_EQ(course::cpu_quota_cores(root.path().string(), self), 0);
}

// Tests that a cgroup v1 quota is read in the cpu controller's tree (a hybrid machine lists a v2
// line too), -1 is none, and no cgroup files at all is no quota.
TEST(CpuQuota, CgroupV1CpuControllerAndNone) {
  course::TemporaryFolder root("cgroup-v1-");
  const std::string self = cgroup_tree(
      root, "4:memory:/x\n2:cpu,cpuacct:/job\n0::/\n",
      {{"cpu/job", "cpu.cfs_quota_us", "400000"}, {"cpu/job", "cpu.cfs_period_us", "100000"}});
  EXPECT_EQ(course::cpu_quota_cores(root.path().string(), self), 4);
  cgroup_tree(root, "", {{"cpu/job", "cpu.cfs_quota_us", "-1"}});
  EXPECT_EQ(course::cpu_quota_cores(root.path().string(), self), 0);
  EXPECT_EQ(course::cpu_quota_cores(root.path().string() + "/none", root.file("no-such")), 0);
  EXPECT_GE(course::available_cores(), 1);
}

TEST(FormatBytes, Units) {
  EXPECT_EQ(course::format_bytes(512), "512 B");
  EXPECT_EQ(course::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(course::format_bytes(3.0 * (1 << 30)), "3.0 GiB");
  EXPECT_EQ(course::format_bytes(-2048), "-2.0 KiB");
}
