// child_process.h defines: ChildProcess, a program started with its output read back line by line
// and killed, stopped or waited for on demand (what a test of a crash needs), self_executable(),
// and a crash test that kills a child again and again (kill_repeatedly).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace course {

/// A program running beside this one, its standard output piped back here.
class ChildProcess {
 public:
  /// Starts `argv[0]` with the arguments `argv` and this process's environment (posix_spawn).
  /// Throws std::runtime_error, naming the program, when it cannot start.
  explicit ChildProcess(const std::vector<std::string>& argv);
  /// The same, with `environment` ("NAME=value" each) added to this process's environment (each
  /// replacing a variable of that name), and the child's standard error sent into the same pipe
  /// as its output when `with_stderr`.
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& environment,
               bool with_stderr);
  /// Kills the child if it still runs, and waits for it: no zombie is left.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The next line the child printed, without its newline; false at the end of its output.
  bool read_line(std::string& line);
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
  bool reaped_ = false;
  int status_ = 0;
};

/// A child's end as waitpid() reports `status`, in words: "exit 1", "killed by SIGKILL".
std::string describe_status(int status);

/// This program's own path (/proc/self/exe), to start it again as a child.
std::string self_executable();

/// A crash test's kill: starts `argv`, a program that prints a line each time it finishes a piece
/// of work, waits for `lines` lines, then kills it (SIGKILL) at a moment drawn from `random` within
/// the time its last piece took, so that most kills land in the middle of the next piece.
/// Returns that time in seconds; std::runtime_error when the program stops printing first.
double kill_at_random_moment(const std::vector<std::string>& argv, int lines,
                             std::mt19937_64& random);

/// What a crash test found (kill_repeatedly).
struct KillReport {
  int kills = 0;
  int survived = 0;          ///< kills after which `check` passed
  double piece_seconds = 0;  ///< the median time of the child's piece of work
  std::string failure;       ///< the first failed check's message, if any
};
/// A crash test: `kills` times, kill_at_random_moment(argv, lines, ...) with a generator seeded
/// with `seed`, then `check()`, which throws (a std::exception saying what is wrong) when what the
/// killed child left behind is not whole.
KillReport kill_repeatedly(const std::vector<std::string>& argv, int lines, int kills,
                           std::uint64_t seed, const std::function<void()>& check);

}  // namespace course
