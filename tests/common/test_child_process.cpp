// Tests of common/child_process.h: a child process: its lines, kills, signals and environment.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/child_process.h"
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

// Tests a child's input: lines written to it are read by the child, closing it ends a child that
// reads to the end, and a write to a child that has ended is an error rather than SIGPIPE (which
// would end the test's process).
TEST(ChildProcess, WritesLinesToItsInput) {
  course::ChildProcess echo({"/bin/sh", "-c", "while read -r word; do echo \"got $word\"; done"},
                            {}, /*with_stderr=*/false, /*with_stdin=*/true);
  std::string line;
  echo.write_line("one");
  ASSERT_TRUE(echo.read_line(line));
  EXPECT_EQ(line, "got one");
  echo.write_line("two");
  ASSERT_TRUE(echo.read_line(line));
  EXPECT_EQ(line, "got two");
  echo.close_input();
  const std::optional<int> status = echo.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(course::describe_status(*status), "exit 0");
  // Each error names the program, and what became of its input.
  const auto error_of = [](course::ChildProcess& child) -> std::string {
    try {
      for (int i = 0; i < 100; ++i) child.write_line("nobody reads this");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of(echo), "/bin/sh's input is closed");

  course::ChildProcess gone({"/bin/sh", "-c", "exit 0"}, {}, false, /*with_stdin=*/true);
  ASSERT_TRUE(gone.wait_for(std::chrono::seconds(30)).has_value());
  EXPECT_EQ(error_of(gone), "/bin/sh's input: Broken pipe");  // EPIPE, not SIGPIPE
  course::ChildProcess plain({"/bin/sh", "-c", "exit 0"});
  EXPECT_EQ(error_of(plain), "/bin/sh's input was not connected (with_stdin)");
}
