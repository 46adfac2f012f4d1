// Tests of common/: device choice, verdict and exit codes, IDX reading, Fashion-MNIST (and take(),
// a split's first samples), memory metering, timing and synthetic data, a child process (its kills,
// signals and environment), the checksum of a tensor, torchrun's environment variables (and what
// a rank says when it cannot join or loses its job), a data-parallel job's sampler, a
// temporary folder, the tutorials' ANN and its test accuracy, and state_dicts (Python's files, the strict load, the checks of a LibTorch
// archive, Adam's state).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/ann.h"
#include "common/child_process.h"
#include "common/cli.h"
#include "common/compare.h"
#include "common/data.h"
#include "common/dataset.h"
#include "common/device.h"
#include "common/generator.h"
#include "common/interrupt.h"
#include "common/launch.h"
#include "common/memory.h"
#include "common/sampler.h"
#include "common/temporary_folder.h"
#include "scratch_files.h"
#include "common/timing.h"
#include "common/verdict.h"
#include "cuda_test.h"
#include "fashion_mnist_test.h"

namespace fs = std::filesystem;

// ---- device choice ---------------------------------------------------------------------------

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
    EXPECT_EQ(course::resolve_device("cuda:" + std::to_string(count - 1)).device.index(), count - 1);
  }
}

// Tests the device description names the CPU threads.
TEST(Describe, CpuNamesThreads) {
  EXPECT_EQ(course::describe(c10::Device(c10::kCPU)).rfind("cpu (", 0), 0u);
}

// Tests that a device's name across processes is "cpu" on the CPU, and on a GPU its index and
// UUID, which every process sees alike (what lesson 14's ranks compare).
TEST(DeviceIdentity, CpuOrIndexAndUuid) {
  EXPECT_EQ(course::device_identity(c10::Device(c10::kCPU)), "cpu");
  if (course::cuda_device_count() > 0) {
    const std::string gpu = course::device_identity(c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(gpu.rfind("cuda:0 GPU-", 0), 0u) << gpu;
  }
}

// Tests byte formatting across units.
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
  const std::string self = cgroup_tree(root, "0::/box/job\n",
                                       {{"box", "cpu.max", "250000 100000"},
                                        {"box/job", "cpu.max", "max 100000"}});
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
  const std::string self = cgroup_tree(root, "4:memory:/x\n2:cpu,cpuacct:/job\n0::/\n",
                                       {{"cpu/job", "cpu.cfs_quota_us", "400000"},
                                        {"cpu/job", "cpu.cfs_period_us", "100000"}});
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

// ---- a child process ---------------------------------------------------------------------------
// Tests a child process: its lines read back one by one, a kill that ends it at once (SIGKILL),
// and a program that does not exist is an error naming it.
TEST(ChildProcess, ReadsLinesAndKills) {
  const auto start = std::chrono::steady_clock::now();
  // exec: the shell becomes `sleep`, so that the kill reaches the one process holding the pipe.
  course::ChildProcess child({"/bin/sh", "-c", "echo one; echo two; exec sleep 60"});
  std::string line;
  ASSERT_TRUE(child.read_line(line));
  EXPECT_EQ(line, "one");
  ASSERT_TRUE(child.read_line(line));
  EXPECT_EQ(line, "two");
  const int status = child.kill();
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_FALSE(child.read_line(line));  // its output ends with it
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  try {
    course::ChildProcess missing({"/no/such/program"});
    ADD_FAILURE() << "started a program that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/program"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::exists(course::self_executable()));
}

// Tests the crash test's loop: each kill is followed by the check, its failures counted and the
// first one kept, and the piece of work between two lines measured.
TEST(ChildProcess, KillRepeatedlyChecksAfterEachKill) {
  int checks = 0;
  const course::KillReport report = course::kill_repeatedly(
      {"/bin/sh", "-c", "while :; do echo piece; sleep 0.02; done"}, /*lines=*/2, /*kills=*/4,
      /*seed=*/1, [&] {
        if (++checks % 2 == 0) throw std::runtime_error("torn " + std::to_string(checks));
      });
  EXPECT_EQ(report.kills, 4);
  EXPECT_EQ(checks, 4);
  EXPECT_EQ(report.survived, 2);
  EXPECT_EQ(report.failure, "torn 2");
  EXPECT_GT(report.piece_seconds, 0.0);
}

// Tests what a distributed job's test needs of a child: variables added to its environment (one
// of them replacing this process's), its standard error in the same pipe, a stopped child that
// wait_for() reports as still running, and its exit status once it ends by itself.
TEST(ChildProcess, EnvironmentSignalsAndWait) {
  setenv("GPU_LESSONS_TEST_VAR", "parent", 1);
  course::ChildProcess child(
      {"/bin/sh", "-c", "echo \"$GPU_LESSONS_TEST_VAR $OTHER_VAR\"; echo oops >&2; exit 3"},
      {"GPU_LESSONS_TEST_VAR=child", "OTHER_VAR=two"}, /*with_stderr=*/true);
  std::string line;
  ASSERT_TRUE(child.read_line(line));
  EXPECT_EQ(line, "child two");
  EXPECT_EQ(child.read_rest(), std::vector<std::string>{"oops"});
  const std::optional<int> status = child.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
  unsetenv("GPU_LESSONS_TEST_VAR");

  course::ChildProcess sleeper({"/bin/sh", "-c", "echo up; exec sleep 60"});
  ASSERT_TRUE(sleeper.read_line(line));
  sleeper.signal(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(sleeper.wait_for(std::chrono::milliseconds(200)).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  const int killed = sleeper.kill();  // SIGKILL ends a stopped process too
  EXPECT_TRUE(WIFSIGNALED(killed));
  EXPECT_EQ(sleeper.wait_for(std::chrono::milliseconds(0)), killed);
  EXPECT_EQ(course::describe_status(killed), "killed by SIGKILL");
  EXPECT_EQ(course::describe_status(*status), "exit 3");
  EXPECT_TRUE(sleeper.read_rest().empty());
}

// ---- torchrun's environment ----------------------------------------------------------------------
// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Tests that a plain run is no job, and that torchrun's variables are read and checked.
TEST(Launch, ReadsWhatTheLauncherSets) {
  {
    ScopedEnv world("WORLD_SIZE", nullptr);
    EXPECT_FALSE(course::rank_from_environment().has_value());
  }
  ScopedEnv world("WORLD_SIZE", "4"), rank("RANK", "3"), local("LOCAL_RANK", "1"),
      local_world("LOCAL_WORLD_SIZE", "2"), addr("MASTER_ADDR", "10.1.2.3"),
      port("MASTER_PORT", "29999"), agent("TORCHELASTIC_USE_AGENT_STORE", "True"),
      restarts("TORCHELASTIC_RESTART_COUNT", "2");
  const auto info = course::rank_from_environment();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 2);
  EXPECT_EQ(info->master_addr, "10.1.2.3");
  EXPECT_EQ(info->master_port, 29999);
  EXPECT_TRUE(info->agent_store);
  EXPECT_EQ(info->restart_count, 2);
}

// Tests that a missing RANK, or one past the world size, is a usage error naming the variable.
TEST(Launch, BadValuesAreUsageErrors) {
  ScopedEnv world("WORLD_SIZE", "2");
  {
    ScopedEnv rank("RANK", nullptr);
    EXPECT_THROW(course::rank_from_environment(), course::UsageError);
  }
  for (const char* bad : {"2", "-1", "one"}) {
    ScopedEnv rank("RANK", bad);
    try {
      course::rank_from_environment();
      ADD_FAILURE() << "RANK=" << bad << " accepted";
    } catch (const course::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("RANK="), std::string::npos) << e.what();
    }
  }
}

// Tests that the variables a program gives the ranks it starts read back as what it meant.
TEST(Launch, RankEnvironmentReadsBack) {
  const std::vector<std::string> env = course::rank_environment(1, 3, 4242);
  std::vector<std::unique_ptr<ScopedEnv>> set;
  for (const std::string& entry : env) {
    const auto eq = entry.find('=');
    set.push_back(std::make_unique<ScopedEnv>(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str()));
  }
  const auto info = course::rank_from_environment();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(info->world_size, 3);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 3);
  EXPECT_EQ(info->master_addr, "127.0.0.1");
  EXPECT_EQ(info->master_port, 4242);
}

// Tests torchrun in miniature on shell "ranks": each started with its own variables, the victim
// killed once it printed its line, the other ranks' ends and lines; a rank past the deadline is
// killed and reported as hung.
TEST(Launch, LocalJobFailsTheVictim) {
  course::LocalJob job;
  job.argv = {"/bin/sh", "-c",
              "echo \"rank $RANK of $WORLD_SIZE at $MASTER_PORT $EXTRA\"; echo 'epoch 1/9';"
              "if [ $RANK = 1 ]; then exec sleep 60; fi; sleep 0.3; exit $((RANK + 3))"};
  job.world_size = 3;
  job.port = 1234;
  job.environment = {"EXTRA=x"};
  job.signal = SIGKILL;
  job.after = "epoch 1/";
  const course::JobEnding ending = course::run_local_job(job);  // ranks 0 and 1 of 3
  ASSERT_EQ(ending.statuses.size(), 1u);
  EXPECT_EQ(course::describe_status(ending.statuses[0]), "exit 3");
  EXPECT_FALSE(ending.hung);
  EXPECT_EQ(ending.outputs[0].at(0), "rank 0 of 3 at 1234 x");
  EXPECT_LT(ending.seconds, 10.0);

  job.signal = 0;  // rank 1 sleeps past the deadline
  job.ranks = {1};
  job.deadline = std::chrono::milliseconds(300);
  const course::JobEnding hung = course::run_local_job(job);
  EXPECT_TRUE(hung.hung);
  EXPECT_EQ(course::describe_status(hung.statuses.at(0)), "killed by SIGKILL");
}

// Tests join_job: what the join returns; what it throws as join_error says, but a CourseError as
// it is.
TEST(Launch, JoinJobTurnsItsErrorsIntoJoinErrors) {
  course::RankInfo info;
  info.rank = 2;
  EXPECT_EQ(course::join_job(info, [] { return 7; }), 7);
  try {
    course::join_job(info, []() -> int { throw std::runtime_error("Socket Timeout"); });
    ADD_FAILURE() << "no error";
  } catch (const course::CourseError& e) {
    EXPECT_STREQ(e.what(), "rank 2 could not join the job at 127.0.0.1:29500: Socket Timeout");
  }
  try {
    course::join_job(info, []() -> int { throw course::CourseError("no backend", "install it"); });
    ADD_FAILURE() << "no error";
  } catch (const course::CourseError& e) {
    EXPECT_STREQ(e.what(), "no backend");
    EXPECT_EQ(e.hint(), "install it");
  }
}

// Tests the error of a rank that cannot join its job: who, where, c10d's reason, and a HINT.
TEST(Launch, JoinErrorSaysWhoAndWhere) {
  course::RankInfo info;
  info.rank = 1;
  info.master_addr = "10.0.0.7";
  info.master_port = 29511;
  const course::CourseError e = course::join_error(info, std::runtime_error("Socket Timeout"));
  EXPECT_STREQ(e.what(), "rank 1 could not join the job at 10.0.0.7:29511: Socket Timeout");
  EXPECT_NE(e.hint().find("MASTER_ADDR"), std::string::npos);
}

// Tests how a rank ends once its job is lost: the error and its HINT on stderr, a FAIL verdict,
// exit 1 at once (std::_Exit, in a child that death tests fork).
TEST(Launch, LostJobExitsOneSayingSo) {
  testing::FLAGS_gtest_death_test_style = "threadsafe";  // LibTorch may have started threads
  const auto lose = [] {
    course::Verdict verdict;
    verdict.check(true, "a claim that held");
    course::exit_lost_job(3, std::runtime_error("Connection closed by peer"), verdict,
                          "lesson 99 rank 3");
  };
  EXPECT_EXIT(lose(), testing::ExitedWithCode(course::kExitFail),
              "error: rank 3 lost the job during training: Connection closed by peer");
  EXPECT_EXIT(lose(), testing::ExitedWithCode(course::kExitFail), "HINT: another rank died");
}

// ---- the sampler of a data-parallel job (sampler.h) --------------------------------------------
// Tests that across ranks and steps every sample of an epoch is taken exactly once, and that a
// global step's shards, in rank order, are one process's batch of world x batch.
TEST(Sampler, EverySampleExactlyOncePerEpoch) {
  using course::shard_indices;
  for (std::int64_t samples : {1000, 1003, 60000}) {
    for (int world : {1, 2, 3, 4}) {
      for (std::int64_t batch : {7, 64}) {
        const torch::Tensor order = course::epoch_order(samples, 9, 0);
        const std::int64_t steps = (samples + world * batch - 1) / (world * batch);
        std::vector<torch::Tensor> all;
        for (std::int64_t s = 0; s < steps; ++s) {
          std::vector<torch::Tensor> step;
          for (int r = 0; r < world; ++r) step.push_back(shard_indices(order, s, r, world, batch));
          const torch::Tensor together = torch::cat(step);
          const torch::Tensor one_process = shard_indices(order, s, 0, 1, world * batch);
          ASSERT_TRUE(torch::equal(together, one_process)) << samples << " " << world << " " << s;
          all.push_back(together);
        }
        EXPECT_TRUE(torch::equal(std::get<0>(torch::cat(all).sort()), torch::arange(samples)))
            << samples << " samples, world " << world << ", batch " << batch;
        // No step beyond the last one, and the last one is not empty.
        EXPECT_EQ(shard_indices(order, steps, 0, world, batch).numel(), 0);
        EXPECT_GT(shard_indices(order, steps - 1, 0, world, batch).numel(), 0);
      }
    }
  }
}

// Tests that the order depends on the seed and the epoch only: every rank draws the same one.
TEST(Sampler, SameOrderOnEveryRankNewEachEpoch) {
  const torch::Tensor a = course::epoch_order(500, 9, 3);
  torch::manual_seed(123);  // the global generator plays no part
  EXPECT_TRUE(torch::equal(a, course::epoch_order(500, 9, 3)));
  EXPECT_FALSE(torch::equal(a, course::epoch_order(500, 9, 4)));
  EXPECT_FALSE(torch::equal(a, course::epoch_order(500, 10, 3)));
}

// Tests that the free port is one a server can listen on.
TEST(Launch, FreePortCanBeBound) {
  const int port = course::free_tcp_port();
  EXPECT_GT(port, 0);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << port;
  close(fd);
}

// ---- comparing results -----------------------------------------------------------------------------
// Tests the differences: absolute, relative to the largest element, and of whole vectors; a
// missing tensor or another shape is never close.
TEST(Compare, Differences) {
  const torch::Tensor b = torch::tensor({1.0f, -4.0f, 2.0f});
  const torch::Tensor a = torch::tensor({1.0f, -4.0f, 2.5f});
  EXPECT_DOUBLE_EQ(course::max_abs_diff(a, b), 0.5);
  EXPECT_DOUBLE_EQ(course::max_rel_diff(a, b), 0.5 / 4);
  EXPECT_NEAR(course::relative_diff(a, b), 0.5 / std::sqrt(21.0), 1e-12);
  EXPECT_EQ(course::max_abs_diff(b, b), 0.0);
  EXPECT_EQ(course::relative_diff(torch::zeros({3}), torch::zeros({3})), 0.0);
  EXPECT_TRUE(std::isinf(course::max_abs_diff(a, torch::Tensor())));
  EXPECT_TRUE(std::isinf(course::max_abs_diff(a, b.reshape({3, 1}))));
  EXPECT_TRUE(std::isinf(course::max_rel_diff(std::vector<torch::Tensor>{a}, {})));
  EXPECT_DOUBLE_EQ(course::max_rel_diff(std::vector<torch::Tensor>{a, b}, {b, b}), 0.5 / 4);
}

// Tests that gradients() lists each parameter's gradient in order, undefined where none is, and
// that such a list never compares as close.
TEST(Compare, GradientsInParameterOrder) {
  const torch::Tensor w = torch::ones({2}, torch::requires_grad());
  const torch::Tensor v = torch::ones({3}, torch::requires_grad());
  (w * 3).sum().backward();
  const std::vector<torch::Tensor> grads = course::gradients({w, v});
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_TRUE(torch::equal(grads[0], torch::full({2}, 3.0f)));
  EXPECT_FALSE(grads[1].defined());
  EXPECT_TRUE(std::isinf(course::max_rel_diff(grads, {grads[0], torch::zeros({3})})));
}

// Tests that the checksum of a tensor's bytes sees a single changed bit, wherever the tensor is.
TEST(Compare, ChecksumSeesOneBit) {
  torch::Tensor a = torch::randn({1000});
  torch::Tensor b = a.clone();
  EXPECT_EQ(course::checksum(a), course::checksum(b));
  EXPECT_EQ(course::checksum(a), course::checksum(a.reshape({10, 100}).t().contiguous().t()));
  torch::Tensor bits = b.view(torch::kInt);
  bits[500] = bits[500].bitwise_xor(1);  // one bit of one float
  EXPECT_NE(course::checksum(a), course::checksum(b));
}

// Tests the reasoning behind the tolerances on real sums: 4,096 terms added by two kernels
// (a reduction and a matrix product, which order their additions differently) agree within
// each dtype's tolerance, a 512 x 512 matmul agrees with float64's, and a sum missing one term
// does not.
TEST(Compare, ToleranceHoldsForSumsInAnotherOrder) {
  EXPECT_LT(course::tolerance_for(torch::kDouble), course::tolerance_for(torch::kFloat));
  EXPECT_LT(course::tolerance_for(torch::kFloat), course::tolerance_for(torch::kBFloat16));
  EXPECT_EQ(course::tolerance_for(torch::kHalf), course::tolerance_for(torch::kBFloat16));
  torch::manual_seed(3);
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const torch::Tensor terms = torch::rand({64, 4096}, dtype);
    const torch::Tensor by_reduction = terms.sum(1);
    const torch::Tensor by_matmul = terms.matmul(torch::ones({4096}, dtype));
    EXPECT_LE(course::max_rel_diff(by_reduction, by_matmul), course::tolerance_for(dtype)) << dtype;
    EXPECT_GT(course::max_rel_diff(terms.slice(1, 1).sum(1), by_matmul), course::tolerance_for(dtype))
        << dtype;
  }
  const torch::Tensor a = torch::randn({512, 512}), b = torch::randn({512, 512});
  EXPECT_LE(course::max_rel_diff(a.matmul(b), a.to(torch::kDouble).matmul(b.to(torch::kDouble))),
            course::tolerance_for(torch::kFloat));
}

// ---- verdict -----------------------------------------------------------------------------------

// Tests that the verdict's exit code agrees with its checks: pass 0, any failure 1, waived 77.
TEST(Verdict, ExitCodesAgree) {
  course::Verdict pass;
  pass.check(true, "a true claim");
  EXPECT_EQ(pass.finish("test"), course::kExitPass);

  course::Verdict fail;
  fail.check(true, "a true claim");
  fail.check(false, "a false claim");
  EXPECT_FALSE(fail.passed());
  EXPECT_EQ(fail.finish("test"), course::kExitFail);

  course::Verdict waived;
  waived.check(true, "a true claim");
  waived.waive("needs 2 GPUs");
  EXPECT_EQ(waived.finish("test"), course::kExitWaived);

  course::Verdict failed_and_waived;
  failed_and_waived.check(false, "a false claim");
  failed_and_waived.waive("needs 2 GPUs");
  EXPECT_EQ(failed_and_waived.finish("test"), course::kExitFail);
}

// Tests that LibTorch errors lose their backtrace and keep their first line.
TEST(ErrorMessage, DropsBacktrace) {
  try {
    torch::ones({2}) + torch::ones({3});
    FAIL() << "no error";
  } catch (const c10::Error& error) {
    const std::string message = course::error_message(error);
    EXPECT_EQ(message.find('\n'), std::string::npos);
    EXPECT_NE(message.find("must match the size"), std::string::npos) << message;
  }
}

// ---- IDX files ---------------------------------------------------------------------------------

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpu_lessons_idx_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An IDX header for unsigned bytes with the given dimensions.
  static std::vector<std::uint8_t> header(const std::vector<std::uint32_t>& dims) {
    std::vector<std::uint8_t> bytes = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
    for (std::uint32_t d : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back((d >> shift) & 0xff);
    }
    return bytes;
  }
  fs::path write_gz(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    const fs::path path = dir_ / name;
    gzFile out = gzopen(path.c_str(), "wb");
    gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(out);
    return path;
  }
  fs::path write_plain(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  fs::path dir_;
};

// Tests that a well-formed gzipped IDX file reads back with its shape and values.
TEST_F(IdxTest, ReadsGoodFile) {
  auto bytes = header({2, 3, 4});
  for (int i = 0; i < 24; ++i) bytes.push_back(static_cast<std::uint8_t>(i * 10));
  const torch::Tensor t = course::read_idx(write_gz("good.gz", bytes));
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({2, 3, 4}));
  EXPECT_EQ(t.scalar_type(), torch::kByte);
  EXPECT_EQ(t.flatten()[23].item<int>(), 230);
}

// Tests that an uncompressed IDX file is read too.
TEST_F(IdxTest, ReadsPlainFile) {
  auto bytes = header({5});
  for (int i = 0; i < 5; ++i) bytes.push_back(static_cast<std::uint8_t>(i));
  EXPECT_EQ(course::read_idx(write_plain("plain.idx", bytes)).sum().item<int>(), 10);
}

// Tests that a truncated file is a DataError that says so and names the package.
TEST_F(IdxTest, TruncatedFileIsDataError) {
  auto bytes = header({10, 28, 28});
  bytes.resize(bytes.size() + 100);
  try {
    course::read_idx(write_gz("truncated.gz", bytes));
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("truncated"), std::string::npos) << error.what();
    EXPECT_NE(error.hint().find("dataset-fashion-mnist"), std::string::npos);
  }
}

// Tests that a header promising more data than any dataset is refused before anything is
// allocated, and that the product of the dimensions cannot wrap around: 2^31 x 4 x 2^31 x 4 is
// 4 modulo 2^64, which 4 bytes of data would otherwise match.
TEST_F(IdxTest, HugeHeaderIsDataErrorBeforeAllocating) {
  for (const auto& dims : std::vector<std::vector<std::uint32_t>>{
           {0xffffffffu}, {65536, 65536}, {0x80000000u, 4, 0x80000000u, 4}, {1, 1, 1, 1u << 31}}) {
    auto bytes = header(dims);
    bytes.resize(bytes.size() + 4);
    try {
      course::read_idx(write_plain("huge.idx", bytes));
      FAIL() << "no error for " << dims.size() << " dimensions";
    } catch (const course::DataError& error) {
      EXPECT_NE(std::string(error.what()).find("promises more than"), std::string::npos)
          << error.what();
    }
  }
}

// Tests that data past what the header promises is refused, and that a gzip bomb (a small file
// inflating to far more than the header promises) is refused after reading one byte too many.
TEST_F(IdxTest, TrailingBytesAndGzipBombAreDataErrors) {
  auto bytes = header({4});
  bytes.resize(bytes.size() + 5);
  EXPECT_THROW(course::read_idx(write_plain("trailing.idx", bytes)), course::DataError);
  bytes = header({4});
  bytes.resize(bytes.size() + (std::size_t{256} << 20));  // 256 MiB of zeros: about 256 KiB gzipped
  const fs::path bomb = write_gz("bomb.gz", bytes);
  EXPECT_LT(fs::file_size(bomb), std::uintmax_t{1} << 20);
  try {
    course::read_idx(bomb);
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("trailing bytes"), std::string::npos) << error.what();
  }
}

// Tests that a file with the wrong magic number is a DataError.
TEST_F(IdxTest, WrongMagicIsDataError) {
  const std::vector<std::uint8_t> bytes = {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 42};
  try {
    course::read_idx(write_gz("magic.gz", bytes));
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("magic"), std::string::npos) << error.what();
  }
}

// Tests that a missing file and a missing folder are DataErrors naming the package and flag.
TEST_F(IdxTest, MissingFileAndFolderAreDataErrors) {
  EXPECT_THROW(course::read_idx(dir_ / "absent.gz"), course::DataError);
  try {
    course::find_fashion_mnist((dir_ / "nowhere").string());
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(error.hint().find("dataset-fashion-mnist"), std::string::npos);
    EXPECT_NE(error.hint().find("--data-dir"), std::string::npos);
  }
}

// Tests that a corrupt gzip stream is a DataError, not a crash or silent garbage.
TEST_F(IdxTest, CorruptGzipIsDataError) {
  auto bytes = header({64});
  bytes.resize(bytes.size() + 64, 7);
  const fs::path path = write_gz("corrupt.gz", bytes);
  std::vector<char> raw(fs::file_size(path));
  std::ifstream(path, std::ios::binary).read(raw.data(), static_cast<std::streamsize>(raw.size()));
  for (size_t i = 12; i + 8 < raw.size(); ++i) raw[i] = static_cast<char>(raw[i] ^ 0x5a);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(raw.data(), static_cast<std::streamsize>(raw.size()));
  EXPECT_THROW(course::read_idx(path), course::DataError);
}

// ---- Fashion-MNIST (the real files, when installed) --------------------------------------------

// Tests the real splits' shapes, label range and pixel range.
TEST_F(FashionMnistTest, ShapesAndRanges) {
  const course::ImageSet& train = this->train();
  const course::ImageSet& test = this->test();
  EXPECT_EQ(train.images.sizes(), torch::IntArrayRef({60000, 28, 28}));
  EXPECT_EQ(test.images.sizes(), torch::IntArrayRef({10000, 28, 28}));
  EXPECT_EQ(train.labels.sizes(), torch::IntArrayRef({60000}));
  EXPECT_EQ(train.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(train.labels.max().item<int64_t>(), 9);
  // Balanced: 6,000 training images per class.
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kLong)));
  EXPECT_EQ(train.images.min().item<float>(), 0.0f);
  EXPECT_EQ(train.images.max().item<float>(), 1.0f);
  EXPECT_STREQ(course::fashion_mnist_class(9), "Ankle boot");
}

// Tests that the environment variable is the fallback for the flag, and the flag wins over it.
TEST_F(FashionMnistTest, EnvironmentVariableIsUsed) {
  const fs::path found = course::find_fashion_mnist("");
  const char* previous = std::getenv(course::kDataDirEnv);
  const std::string saved = previous != nullptr ? previous : "";
  ::setenv(course::kDataDirEnv, "/definitely/not/here", 1);
  EXPECT_THROW(course::find_fashion_mnist(""), course::DataError);
  EXPECT_EQ(course::find_fashion_mnist(found.string()), found);
  if (previous != nullptr) {
    ::setenv(course::kDataDirEnv, saved.c_str(), 1);
  } else {
    ::unsetenv(course::kDataDirEnv);
  }
}

// Tests that take() gives a split's first samples as views of it, and all of it when asked for more.
TEST(Take, FirstSamplesAsViews) {
  const course::ImageSet data{torch::rand({10, 28, 28}), torch::arange(10, torch::kLong)};
  const course::ImageSet first = course::take(data, 4);
  EXPECT_EQ(first.images.sizes(), torch::IntArrayRef({4, 28, 28}));
  EXPECT_TRUE(torch::equal(first.labels, torch::arange(4, torch::kLong)));
  EXPECT_EQ(first.images.data_ptr(), data.images.data_ptr()) << "a view, not a copy";
  EXPECT_EQ(course::take(data, 100).labels.size(0), 10);
}

// ---- memory ------------------------------------------------------------------------------------

// Tests that the counting allocator sees a tensor's bytes come and go, and its peak.
TEST(CpuMemory, CountsTensorStorage) {
  course::install_counting_cpu_allocator();
  const c10::Device cpu(c10::kCPU);
  course::reset_peak_memory(cpu);
  const auto before = course::memory_stats(cpu);
  constexpr std::int64_t kBytes = 4 << 20;
  {
    const torch::Tensor t = torch::empty({kBytes / 4});
    const auto during = course::memory_stats(cpu);
    EXPECT_EQ(during.allocated - before.allocated, kBytes);
    EXPECT_GE(during.allocations, 1);
  }
  const auto after = course::memory_stats(cpu);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated - before.allocated, kBytes);
}

// Tests that a CPU budget turns an oversized allocation into c10::OutOfMemoryError.
TEST(CpuMemory, BudgetThrowsOutOfMemory) {
  course::install_counting_cpu_allocator();
  const auto in_use = course::memory_stats(c10::Device(c10::kCPU)).allocated;
  course::set_cpu_memory_budget(in_use + (1 << 20));
  EXPECT_NO_THROW(torch::empty({1000}));
  EXPECT_THROW(torch::empty({1 << 20}), c10::OutOfMemoryError);
  course::set_cpu_memory_budget(0);
  EXPECT_NO_THROW(torch::empty({1 << 20}));
}

// Tests that the CUDA caching allocator's numbers follow a tensor (GPU only).
TEST_F(CudaTest, CachingAllocatorStats) {
  course::empty_cache(device);
  course::reset_peak_memory(device);
  const auto before = course::memory_stats(device);
  constexpr std::int64_t kBytes = 64 << 20;
  {
    const torch::Tensor t = torch::empty({kBytes / 4}, torch::TensorOptions().device(device));
    EXPECT_GE(course::memory_stats(device).allocated - before.allocated, kBytes);
  }
  const auto freed = course::memory_stats(device);
  EXPECT_EQ(freed.allocated, before.allocated);
  EXPECT_GE(freed.reserved, before.reserved + kBytes);  // the cache keeps the block
  course::empty_cache(device);
  EXPECT_LT(course::memory_stats(device).reserved, freed.reserved);
  EXPECT_GT(course::device_memory(device).total, 0);
}

// ---- generators ----------------------------------------------------------------------------

// Tests that a CPU generator state read and put back makes the next draws repeat.
TEST(Generator, StatePutBackRepeatsTheDraws) {
  torch::manual_seed(3);
  const torch::Tensor state = course::rng_state(c10::kCPU);
  const torch::Tensor first = torch::rand({8});
  EXPECT_FALSE(torch::equal(torch::rand({8}), first));
  course::set_rng_state(c10::kCPU, state);
  EXPECT_TRUE(torch::equal(torch::rand({8}), first));
}

// ---- timing and synthetic data -----------------------------------------------------------------

// Tests that the median lies between the fastest and slowest run and counts the runs.
TEST(Timing, MedianIsBetweenMinAndMax) {
  int calls = 0;
  const auto t = course::time_median([&] { ++calls; torch::mm(torch::ones({64, 64}), torch::ones({64, 64})); },
                                     c10::Device(c10::kCPU), /*warmup=*/2, /*runs=*/5);
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(t.runs, 5);
  EXPECT_LE(t.min_s, t.median_s);
  EXPECT_LE(t.median_s, t.max_s);
  EXPECT_GT(t.min_s, 0.0);
}

// Tests the count of operators: each torch::add dispatches (at least) one operator, twice the
// work counts twice, and nothing is counted once the call is over.
TEST(Timing, CountOperatorsCountsEachDispatch) {
  const torch::Tensor a = torch::ones({8}), b = torch::ones({8});
  const std::int64_t one = course::count_operators([&] { (void)torch::add(a, b); });
  EXPECT_GE(one, 1);
  EXPECT_EQ(course::count_operators([&] { (void)torch::add(a, b); (void)torch::add(a, b); }), 2 * one);
  EXPECT_EQ(course::count_operators([] {}), 0);
}

// Tests the spread's wording and the busy-machine rule (slowest over 1.5 times the fastest).
TEST(Timing, DescribeAndBusy) {
  course::Timing t;
  t.runs = 4;
  t.median_s = 0.412;
  t.min_s = 0.391;
  t.max_s = 0.52;
  EXPECT_EQ(course::describe(t, "s"), "0.412 s (0.391-0.520, 4 runs)");
  EXPECT_EQ(course::describe_ms(t), "412.000 ms (391.000-520.000, 4 runs)");
  EXPECT_FALSE(course::looks_busy(t));
  t.max_s = 0.6;
  EXPECT_TRUE(course::looks_busy(t));
  t.runs = 1;  // one run has no spread to judge
  EXPECT_FALSE(course::looks_busy(t));
  EXPECT_EQ(course::describe(t, "s"), "0.412 s (one run, no spread)");
}

// Tests the note a lesson prints under its timings: the busy note when one of them spreads too
// far; else a single run's note when one of them is one run; else nothing.
TEST(Timing, NoteUnderTimings) {
  const course::Timing steady{0.4, 0.39, 0.41, 5}, spread{0.4, 0.3, 0.6, 5}, single{0.4, 0.4, 0.4, 1};
  EXPECT_EQ(course::timing_note({steady, steady}), "");
  EXPECT_EQ(course::timing_note({}), "");
  EXPECT_EQ(course::timing_note({steady, spread}), course::busy_note() + "\n");
  EXPECT_EQ(course::timing_note({spread, single}), course::busy_note() + "\n");
  const std::string one = course::timing_note({steady, single});
  EXPECT_EQ(one.rfind("note: one run, so no spread", 0), 0u) << one;
  EXPECT_EQ(one.back(), '\n');
}

// Tests the median for odd, even and empty inputs.
TEST(Timing, Median) {
  EXPECT_EQ(course::median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(course::median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(course::median({}), 0.0);
}

// Tests the summary of timings already taken: median, fastest, slowest, count; zeros for none.
TEST(Timing, Summarize) {
  const course::Timing t = course::summarize({0.3, 0.1, 0.2, 0.5});
  EXPECT_EQ(t.runs, 4);
  EXPECT_EQ(t.min_s, 0.1);
  EXPECT_EQ(t.max_s, 0.5);
  EXPECT_DOUBLE_EQ(t.median_s, 0.25);
  const course::Timing none = course::summarize({});
  EXPECT_EQ(none.runs, 0);
  EXPECT_EQ(none.median_s, 0.0);
  EXPECT_FALSE(course::looks_busy(none));
  const course::Timing one = course::per_piece(t, 4);  // four steps timed together: one of them
  EXPECT_EQ(one.runs, 4);
  EXPECT_DOUBLE_EQ(one.min_s, 0.025);
  EXPECT_DOUBLE_EQ(one.max_s, 0.125);
  EXPECT_DOUBLE_EQ(one.median_s, 0.0625);
}

// Tests that under a StopOnInterrupt a SIGINT only sets the stop request (the process goes on),
// that the next guard starts without one, and that the previous handler comes back afterwards.
TEST(StopOnInterrupt, SigintBecomesAStopRequest) {
  struct sigaction before {};
  ::sigaction(SIGINT, nullptr, &before);
  {
    course::StopOnInterrupt guard;
    EXPECT_FALSE(course::stop_requested());
    ::raise(SIGINT);
    EXPECT_TRUE(course::stop_requested());
  }
  {
    course::StopOnInterrupt again;
    EXPECT_FALSE(course::stop_requested());
  }
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

// A lesson's main as every lesson writes it: `int main(...) try { ... } catch (...) { return
// course::report_error(); }`.
static int lesson_main_guarded(int (*body)(int, char**), int argc, char** argv) try {
  return body(argc, argv);
} catch (...) {
  return course::report_error();
}

// Tests that report_error(), in a lesson's catch block, turns Interrupted into its message and
// exit code 130.
TEST(StopOnInterrupt, ReportErrorExits130) {
  testing::internal::CaptureStdout();
  const int code = lesson_main_guarded(
      [](int, char**) -> int { throw course::Interrupted("epoch 2 abandoned"); }, 0, nullptr);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, course::kExitInterrupted);
  EXPECT_NE(out.find("stopped (Ctrl-C): epoch 2 abandoned"), std::string::npos) << out;
}

// Tests what an epoch loop that saves after every epoch says when Ctrl-C stops it: the epoch
// abandoned and what the checkpoint holds, or that nothing is saved.
TEST(StopOnInterrupt, AbandonedEpochSaysWhatIsKept) {
  const course::Interrupted stop("after step 12");
  EXPECT_STREQ(course::epoch_abandoned(stop, 2, "run.pt").what(),
               "epoch 3 abandoned after step 12; run.pt holds epoch 2: run the same command to "
               "resume from there");
  EXPECT_STREQ(course::epoch_abandoned(stop, 0, "run.pt").what(),
               "epoch 1 abandoned after step 12; nothing is saved");
  EXPECT_STREQ(course::epoch_abandoned(stop, 2, "").what(),
               "epoch 3 abandoned after step 12; nothing is saved");
}

// Tests the HINTs for a learner's mistakes, with the errors LibTorch really raises where the CPU
// can raise them: tensors on two devices (the meta device stands in for a GPU), and a view
// detached in place. Anything else is still reported as a bug.
TEST(Hints, NameTheLearnersMistake) {
  std::string mismatch;
  try {
    (void)torch::add(torch::ones({2, 2}), torch::ones({2, 2}, torch::Device(torch::kMeta)));
  } catch (const std::exception& e) {
    mismatch = course::error_message(e);
  }
  ASSERT_FALSE(mismatch.empty()) << "LibTorch added a CPU tensor to a meta one";
  EXPECT_NE(course::hint_for(mismatch).find("different devices"), std::string::npos) << mismatch;
  std::string views;
  try {
    const torch::Tensor base = torch::ones({4}, torch::requires_grad());
    torch::Tensor view = base.slice(0, 0, 2);
    view.detach_();
  } catch (const std::exception& e) {
    views = course::error_message(e);
  }
  if (views.empty()) views = "Can't detach views in-place. Use detach() instead.";  // 2.x allows it
  EXPECT_NE(course::hint_for(views).find("flat"), std::string::npos) << views;
  EXPECT_NE(course::hint_for("lab 05.2 is not done: move the model").find("grade-lab"),
            std::string::npos);
  EXPECT_NE(course::hint_for("CUDA out of memory. Tried to allocate 2.00 GiB").find("lesson 07"),
            std::string::npos);
  EXPECT_NE(course::hint_for("std::bad_function_call").find("bug"), std::string::npos);
}

// Tests the HINTs for the mistakes lesson 04 shows, with the messages LibTorch really printed
// for them (error_message's first line; where that line is long, its first sentence): the
// mismatch of a model, labels or predictions left on the CPU, and CUDA asked for where there is
// none, by .cuda() or by a file saved on a GPU loaded without a device. On this machine, when it
// has no CUDA, .cuda() is also run, and its message given the same HINT.
TEST(Hints, NameEachOfLessonFoursMistakes) {
  const auto names = [](const std::string& message, const char* fix) {
    return course::hint_for(message).find(fix) != std::string::npos;
  };
  // A model, labels or predictions on the meta device (a GPU's stand-in) meet a CPU tensor
  // (LibTorch 1.13 and 2.11 alike); on a GPU the devices are cuda:0 and cpu.
  const std::string mismatch =
      "Expected all tensors to be on the same device, but found at least two devices, meta and "
      "cpu!";
  EXPECT_TRUE(names(mismatch, "model->to(device)"));
  EXPECT_TRUE(names(mismatch, "labels"));
  // .cuda() or .to(torch::kCUDA): Debian's LibTorch 1.13 (built without CUDA), then 2.11 (built
  // with CUDA) on a machine without a GPU.
  const std::vector<std::string> no_cuda = {
      "PyTorch is not linked with support for cuda devices",
      "CUDA error: CUDA driver version is insufficient for CUDA runtime version",
      // torch::randn(..., torch::kCUDA): 1.13, then 2.11 without a GPU.
      "Could not run 'aten::empty.memory_format' with arguments from the 'CUDA' backend. This "
      "could be because the operator doesn't exist for this backend, or was omitted during the "
      "selective/custom build process (if using custom build).",
      "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
      "installed a driver from http://www.nvidia.com/Download/index.aspx",
      // The same load by 2.11 on a GPU machine whose GPUs CUDA_VISIBLE_DEVICES hides (H200).
      "No CUDA GPUs are available",
      // torch::load(model, path) of a file saved on a GPU, no device named: 1.13 (2.11 without
      // a GPU says "Found no NVIDIA driver", above).
      "Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend. This could be "
      "because the operator doesn't exist for this backend, or was omitted during the "
      "selective/custom build process (if using custom build).",
  };
  for (const std::string& message : no_cuda) {
    EXPECT_TRUE(names(message, ".to(device)")) << message;
    EXPECT_TRUE(names(message, "map_location")) << message;
    EXPECT_TRUE(names(message, "lesson 04")) << message;
  }
  if (!torch::cuda::is_available()) {
    std::string message;
    try {
      (void)torch::ones({2}).cuda();
    } catch (const std::exception& e) {
      message = course::error_message(e);
    }
    ASSERT_FALSE(message.empty()) << ".cuda() ran on a machine without CUDA";
    EXPECT_TRUE(names(message, ".to(device)")) << message;
  }
}

// Tests that report_error() prints a lab TODO's throw with its HINT and ends with RESULT: FAIL.
TEST(Hints, ReportErrorNamesALabTodo) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = lesson_main_guarded(
      [](int, char**) -> int { throw std::logic_error("lab 02.1 is not done: move every parameter"); },
      0, nullptr);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, course::kExitFail);
  EXPECT_NE(err.find("error: lab 02.1 is not done"), std::string::npos) << err;
  EXPECT_NE(err.find("HINT: a lab TODO is still to do"), std::string::npos) << err;
  EXPECT_NE(out.find("RESULT: FAIL"), std::string::npos) << out;
}

// Tests the training state's bytes: parameters, then their gradients, then Adam's two moments.
TEST(TrainingStateBytes, ParametersGradientsAndAdamsMoments) {
  torch::nn::Linear model(3, 2);  // 8 floats: 32 bytes
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  EXPECT_EQ(course::training_state_bytes(*model, adam), 32);
  model->forward(torch::ones({1, 3})).sum().backward();
  EXPECT_EQ(course::training_state_bytes(*model, adam), 64);
  adam.step();
  EXPECT_EQ(course::training_state_bytes(*model, adam), 128);
}


// Tests that a state_dict written for Python reads back by the same names, in order, equal.
// Tests that a TemporaryFolder is a new empty folder of its own, gone with all it holds (files
// and folders in it) when its scope ends.
TEST(Ann, TheTutorialsLayersNamesAndAccuracy) {
  torch::manual_seed(0);
  course::ANN model;
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "out.weight", "out.bias"}));
  course::ImageSet test{torch::rand({6, 28, 28}), torch::zeros({6}, torch::kLong)};
  const torch::Tensor logits = model->forward(test.images);
  ASSERT_EQ(logits.sizes(), (std::vector<std::int64_t>{6, 10}));
  // Labels that agree with the model's choice on the first four images only: 4/6.
  test.labels = std::get<1>(logits.max(1)).clone();
  test.labels.slice(0, 4) = (test.labels.slice(0, 4) + 1) % 10;
  model->train();
  EXPECT_DOUBLE_EQ(course::test_accuracy(model, test, torch::kCPU), 4.0 / 6.0);
  EXPECT_FALSE(model->is_training());
}

// Tests that test_accuracy takes a lesson's own model as well (any module holder whose forward
// takes the images): lesson 09's is a Cloneable ANN.
TEST(Ann, TestAccuracyOfAnotherModel) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 10));
  course::ImageSet test{torch::rand({8, 28, 28}), torch::zeros({8}, torch::kLong)};
  test.labels = std::get<1>(model->forward(test.images).max(1)).clone();
  test.labels.slice(0, 6) = (test.labels.slice(0, 6) + 1) % 10;  // wrong on the last two: 6/8
  EXPECT_DOUBLE_EQ(course::test_accuracy(model, test, torch::kCPU), 6.0 / 8.0);
  EXPECT_FALSE(model->is_training());
}

// Tests one epoch of the tutorial's loop: every batch is a step, the loss falls from one epoch to
// the next, and a Ctrl-C ends the epoch after the step under way.
TEST(Ann, OneEpochOfTheTutorialsLoopStopsOnCtrlC) {
  torch::manual_seed(1);
  const torch::Tensor images = torch::rand({256, 28, 28});
  const course::FashionMNIST train(
      course::ImageSet{images, torch::randint(10, {256}, torch::kLong)});
  course::ANN model;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto loader = course::make_train_loader(train, 64, 1);
  const auto [steps, first_loss] = course::train_epoch(model, adam, *loader, torch::kCPU);
  EXPECT_EQ(steps, 4);
  EXPECT_TRUE(model->is_training());
  EXPECT_LT(course::train_epoch(model, adam, *loader, torch::kCPU).second, first_loss);
  course::StopOnInterrupt guard;
  ::raise(SIGINT);
  try {
    course::train_epoch(model, adam, *loader, torch::kCPU);
    ADD_FAILURE() << "the epoch went on after a Ctrl-C";
  } catch (const course::Interrupted& stop) {
    EXPECT_STREQ(stop.what(), "after step 1");
  }
}

TEST(TemporaryFolder, NewEmptyAndGoneWithItsContentsAfterItsScope) {
  fs::path kept;
  {
    const course::TemporaryFolder a("common-test-"), b("common-test-");
    kept = a.path();
    EXPECT_TRUE(fs::is_directory(kept));
    EXPECT_TRUE(fs::is_empty(kept));
    EXPECT_NE(a.path(), b.path());
    EXPECT_EQ(a.file("x.pt"), (kept / "x.pt").string());
    std::ofstream(a.file("x.pt")) << "x";
    fs::create_directory(kept / "inner");
    std::ofstream(kept / "inner" / "y.pt") << "y";
  }
  EXPECT_FALSE(fs::exists(kept));
}
