// program_run.h defines: ProgramRun and run_program(), a program of the course run to its end
// from a test, its exit code and all it printed (standard output and error) read back, for the
// tests of what a program does on the command line.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/child_process.h"  // defines: ChildProcess, describe_status

/// How a program ended, and what it printed.
struct ProgramRun {
  int exit_code = -1;  ///< -1 when a signal ended it (`status` says which)
  std::string status;  ///< "exit 2", "killed by SIGKILL"
  std::string output;  ///< its standard output and error, as printed

  bool printed(const std::string& text) const { return output.find(text) != std::string::npos; }
  /// What a failed expectation shows: how it ended, then its output.
  std::string what() const { return status + ", having printed:\n" + output; }
};

/// Runs `argv` (the program first) to its end. CTest's time limit stops a program that hangs.
inline ProgramRun run_program(const std::vector<std::string>& argv) {
  course::ChildProcess child(argv, {}, /*with_stderr=*/true);
  ProgramRun run;
  for (const std::string& line : child.read_rest()) run.output += line + "\n";
  // Its output ended: it is exiting. (A program that closed its output and went on is killed.)
  const std::optional<int> ended = child.wait_for(std::chrono::seconds(60));
  const int status = ended ? *ended : child.kill();
  run.status = course::describe_status(status);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}
