// child_process.h defines: ChildProcess, a program started with its output read back line by line
// (and, when asked, lines written to its input) and killed, stopped or waited for on demand (what a
// test of a crash needs), describe_status() and self_executable().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace course {

/// A program running beside this one, its standard output piped back here.
class ChildProcess {
 public:
  /// Starts `argv[0]` with the arguments `argv` (posix_spawn), in this process's environment plus
  /// `environment` ("NAME=value" each, replacing a variable of that name), its standard error
  /// sent into the pipe of its output too when `with_stderr`, its standard input a connection
  /// that write_line() writes to when `with_stdin` (else this process's own input). Throws
  /// std::runtime_error, naming the program, when it cannot start.
  explicit ChildProcess(const std::vector<std::string>& argv,
                        const std::vector<std::string>& environment = {}, bool with_stderr = false,
                        bool with_stdin = false);
  /// Kills the child if it still runs, and waits for it: no zombie is left.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The next line the child printed, without its newline; false at the end of its output.
  bool read_line(std::string& line);
  /// Writes `line` and a newline to the child's input (started `with_stdin`). Throws
  /// std::runtime_error when the child no longer reads it (it ended): never SIGPIPE.
  void write_line(const std::string& line);
  /// Closes the child's input: a child that reads it to its end sees the end.
  void close_input();
  /// Every line the child prints from now until its output ends (it exited, or was killed).
  std::vector<std::string> read_rest();
  /// Sends SIGKILL (no chance to clean up: a crash, a power cut) and waits for the child.
  /// Returns its status as waitpid() reports it.
  int kill();
  /// Sends `signal` to the child (SIGSTOP stops it where it stands, as a hung process would).
  void signal(int signal);
  /// Waits at most `limit` for the child to end by itself: its status as waitpid() reports it,
  /// or nothing when it still runs then.
  std::optional<int> wait_for(std::chrono::milliseconds limit);

 private:
  pid_t pid_ = -1;
  int out_ = -1;  // the read end of the child's stdout
  int in_ = -1;   // this end of the child's stdin (a socket: a write to a gone child fails, EPIPE)
  bool with_stdin_ = false;
  std::string program_;  // argv[0], for errors
  bool reaped_ = false;
  int status_ = 0;
};

/// A child's end as waitpid() reports `status`, in words: "exit 1", "killed by SIGKILL".
std::string describe_status(int status);

/// This program's own path (/proc/self/exe), to start it again as a child.
std::string self_executable();

}  // namespace course
