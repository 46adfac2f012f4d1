// Tests of distributed/launch.h: torchrun's environment variables, what a rank says when it cannot
// join or loses its job, ranks started on this host, a free port.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/device.h"
#include "common/verdict.h"
#include "distributed/launch.h"
// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
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
    set.push_back(
        std::make_unique<ScopedEnv>(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str()));
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

// Tests that a device's name across processes is "cpu" on the CPU, and on a GPU its index and
// UUID, which every process sees alike (what lesson 17's ranks compare).
TEST(DeviceIdentity, CpuOrIndexAndUuid) {
  EXPECT_EQ(course::device_identity(c10::Device(c10::kCPU)), "cpu");
  if (course::cuda_device_count() > 0) {
    const std::string gpu = course::device_identity(c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(gpu.rfind("cuda:0 GPU-", 0), 0u) << gpu;
  }
}
