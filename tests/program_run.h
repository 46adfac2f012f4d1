// program_run.h defines: ProgramRun, run_program() and program_ended(), a program of the course
// run to its end from a test, its exit code and all it printed (standard output and error) read
// back, for the tests of what a program does on the command line; built_program() and
// test_python(), which find the program and the Python where a build was carried to another
// machine.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/child_process.h"  // defines: ChildProcess, describe_status

/// A program of the build, at `built` (the path CMake gave it), or beside this test binary when
/// the build was carried elsewhere (another machine, another folder).
inline std::string built_program(const std::string& built) {
  if (std::filesystem::exists(built)) return built;
  return (std::filesystem::path(course::self_executable()).parent_path() /
          std::filesystem::path(built).filename())
      .string();
}

/// The Python whose torch is this LibTorch: $GPU_LESSONS_PYTHON, else `built` (CMake's; empty
/// when there is none).
inline std::string test_python(const std::string& built) {
  const char* chosen = std::getenv("GPU_LESSONS_PYTHON");
  return chosen && *chosen ? chosen : built;
}

/// A file of the source tree at `built` (CMake's path), else the same path under the current
/// folder's (a tree copied elsewhere, its tests run from its root).
inline std::string source_file(const std::string& built, const std::string& in_tree) {
  return std::filesystem::exists(built) ? built : in_tree;
}

/// How a program ended, and what it printed.
struct ProgramRun {
  int exit_code = -1;  ///< -1 when a signal ended it (`status` says which)
  std::string status;  ///< "exit 2", "killed by SIGKILL"
  std::string output;  ///< its standard output and error, as printed

  bool printed(const std::string& text) const { return output.find(text) != std::string::npos; }
  /// What a failed expectation shows: how it ended, then its output.
  std::string what() const { return status + ", having printed:\n" + output; }
};

/// `lines`, each ended by a newline, as the program printed them.
inline std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

/// How `child`, whose output has ended, ended; `output` is all it printed.
inline ProgramRun program_ended(course::ChildProcess& child, std::string output) {
  ProgramRun run;
  run.output = std::move(output);
  // Its output ended: it is exiting. (A program that closed its output and went on is killed.)
  const std::optional<int> ended = child.wait_for(std::chrono::seconds(60));
  const int status = ended ? *ended : child.kill();
  run.status = course::describe_status(status);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

/// Runs `argv` (the program first) to its end, with `environment` ("NAME=value" each) added to
/// this process's, its standard error in its output when `with_stderr`. CTest's time limit stops
/// a program that hangs.
inline ProgramRun run_program(const std::vector<std::string>& argv,
                              const std::vector<std::string>& environment = {},
                              bool with_stderr = true) {
  course::ChildProcess child(argv, environment, with_stderr);
  return program_ended(child, joined(child.read_rest()));
}
