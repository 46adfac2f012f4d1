// child_process.cpp: a child process over posix_spawn, a pipe and SIGKILL.
#include "common/child_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace course {

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::vector<std::string>& environment, bool with_stderr,
                           bool with_stdin) {
  if (argv.empty()) throw std::runtime_error("ChildProcess: no program to start");
  // This process's environment, less the variables `environment` sets, then those.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('=') + 1);
    const bool replaced = std::any_of(environment.begin(), environment.end(),
                                      [&](const std::string& v) { return v.rfind(name, 0) == 0; });
    if (!replaced) env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), environment.begin(), environment.end());
  std::vector<char*> env_pointers;
  for (auto& e : env_strings) env_pointers.push_back(e.data());
  env_pointers.push_back(nullptr);

  int pipe_ends[2];
  if (::pipe(pipe_ends) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  // The input: a socket pair rather than a pipe, so that a write to a child that ended fails
  // (send's MSG_NOSIGNAL) instead of raising SIGPIPE, which ends this process.
  int input_ends[2] = {-1, -1};
  if (with_stdin && ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, input_ends) != 0) {
    const int error = errno;
    ::close(pipe_ends[0]);
    ::close(pipe_ends[1]);
    throw std::runtime_error(std::string("socketpair: ") + std::strerror(error));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDOUT_FILENO);
  if (with_stderr) posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_ends[0]);
  if (with_stdin) posix_spawn_file_actions_adddup2(&actions, input_ends[1], STDIN_FILENO);
  std::vector<std::string> args = argv;
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  const int spawned =
      posix_spawn(&pid_, args[0].c_str(), &actions, nullptr, pointers.data(), env_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_ends[1]);
  if (with_stdin) ::close(input_ends[1]);
  if (spawned != 0) {
    ::close(pipe_ends[0]);
    if (with_stdin) ::close(input_ends[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(spawned));
  }
  out_ = pipe_ends[0];
  in_ = input_ends[0];
  with_stdin_ = with_stdin;
  program_ = argv[0];
}

ChildProcess::~ChildProcess() {
  close_input();
  if (!reaped_) kill();
  if (out_ >= 0) ::close(out_);
}

void ChildProcess::write_line(const std::string& line) {
  if (in_ < 0)
    throw std::runtime_error(program_ + "'s input " +
                             (with_stdin_ ? "is closed" : "was not connected (with_stdin)"));
  const std::string text = line + "\n";
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::send(in_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(program_ + "'s input: " + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

void ChildProcess::close_input() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

bool ChildProcess::read_line(std::string& line) {
  line.clear();
  char c = 0;
  while (true) {
    const ssize_t n = ::read(out_, &c, 1);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (c == '\n') return true;
    line.push_back(c);
  }
}

std::vector<std::string> ChildProcess::read_rest() {
  std::vector<std::string> lines;
  std::string line;
  while (read_line(line)) lines.push_back(line);
  if (!line.empty()) lines.push_back(line);  // the last line, without its newline
  return lines;
}

int ChildProcess::kill() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  return status_;
}

void ChildProcess::signal(int signal) {
  if (!reaped_) ::kill(pid_, signal);
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!reaped_) {
    const pid_t done = ::waitpid(pid_, &status_, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return "killed by " + (name != nullptr ? "SIG" + std::string(name)
                                           : "signal " + std::to_string(WTERMSIG(status)));
  }
  return "status " + std::to_string(status);
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

}  // namespace course
