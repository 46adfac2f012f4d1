// launch.cpp: torchrun's environment variables, read and checked; what a rank says when it
// cannot join its job or loses it; the ranks of a job started on this host.
#include "distributed/launch.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "common/child_process.h"  // defines: ChildProcess
#include "common/device.h"         // defines: list_gpus
#include "common/verdict.h"        // defines: UsageError, Verdict, print_error, error_message

namespace course {

namespace {

// The value of an environment variable, or nullptr when it is unset or empty.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int env_int(const char* name, int fallback, int min, int max) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long value = std::strtol(v, &end, 10);
  if (*end != '\0' || value < min || value > max) {
    throw UsageError(std::string(name) + "=" + v + " is not a whole number in [" +
                         std::to_string(min) + ", " + std::to_string(max) + "]",
                     "let torchrun set it, or set it to the right value");
  }
  return static_cast<int>(value);
}

}  // namespace

//! [rank-from-environment]
std::optional<RankInfo> rank_from_environment() {
  if (env("WORLD_SIZE") == nullptr) return std::nullopt;  // a plain run: one process
  RankInfo info;
  info.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 16);
  if (env("RANK") == nullptr) {
    throw UsageError("WORLD_SIZE is set but RANK is not",
                     "launch with torchrun --no-python, which sets both for every rank");
  }
  info.rank = env_int("RANK", 0, 0, info.world_size - 1);
  info.local_rank = env_int("LOCAL_RANK", info.rank, 0, info.world_size - 1);
  info.local_world_size = env_int("LOCAL_WORLD_SIZE", info.world_size, 1, info.world_size);
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  info.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  info.agent_store = agent != nullptr && std::string(agent) == "True";
  info.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20);
  return info;
}
//! [rank-from-environment]

std::vector<std::string> rank_environment(int rank, int world_size, int port) {
  const std::string r = std::to_string(rank), w = std::to_string(world_size);
  return {"MASTER_ADDR=127.0.0.1",
          "MASTER_PORT=" + std::to_string(port),
          "WORLD_SIZE=" + w,
          "LOCAL_WORLD_SIZE=" + w,
          "RANK=" + r,
          "LOCAL_RANK=" + r};
}

std::string device_identity(const c10::Device& device) {
  if (!device.is_cuda()) return "cpu";
  for (const auto& gpu : list_gpus()) {
    if (gpu.index == device.index()) return device.str() + " " + gpu.uuid;
  }
  return device.str();
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_tcp_port: no socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);  // port 0 asked the kernel for a free one; it stays free for a while
  if (!ok) throw std::runtime_error("free_tcp_port: no free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

CourseError join_error(const RankInfo& info, const std::exception& why) {
  return CourseError("rank " + std::to_string(info.rank) + " could not join the job at " +
                         info.master_addr + ":" + std::to_string(info.master_port) + ": " +
                         error_message(why),
                     "start all ranks within --timeout, with the same MASTER_ADDR and "
                     "MASTER_PORT (torchrun sets them); read the other ranks' output");
}

void exit_lost_job(int rank, const std::exception& why, Verdict& verdict,
                   const std::string& summary) {
  print_error(
      "rank " + std::to_string(rank) + " lost the job during training: " + error_message(why),
      "another rank died or stopped: its own output says why");
  verdict.check(false, "every rank finished training");
  const int code = verdict.finish(summary);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

JobEnding run_local_job(const LocalJob& job) {
  std::vector<std::unique_ptr<ChildProcess>> ranks(job.world_size);
  for (const int r : job.ranks) {
    std::vector<std::string> env = rank_environment(r, job.world_size, job.port);
    env.insert(env.end(), job.environment.begin(), job.environment.end());
    ranks.at(r) = std::make_unique<ChildProcess>(job.argv, env, /*with_stderr=*/true);
  }
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto start = std::chrono::steady_clock::now();
  const bool failing = job.signal != 0 && ranks.at(job.victim) != nullptr;
  if (failing) {
    std::string line;
    while (ranks[job.victim]->read_line(line) && line.find(job.after) == std::string::npos) {
    }
    ranks[job.victim]->signal(job.signal);
    start = std::chrono::steady_clock::now();
  }
  std::vector<std::string> before;  // the first rank's lines up to `from`
  if (!failing && !job.from.empty()) {
    std::string line;
    while (true) {
      const bool more = ranks.at(job.ranks.front())->read_line(line);
      if (more || !line.empty()) before.push_back(line);
      if (!more || line.find(job.from) != std::string::npos) break;
    }
    start = std::chrono::steady_clock::now();
  }
  JobEnding ending;
  for (const int r : job.ranks) {
    if (failing && r == job.victim) continue;
    const auto left = job.deadline - std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - start);
    const std::optional<int> status =
        ranks[r]->wait_for(std::max(left, std::chrono::milliseconds(0)));
    ending.hung = ending.hung || !status;
    ending.statuses.push_back(status ? *status : ranks[r]->kill());
    ending.seconds = since(start);
    ending.outputs.push_back(ranks[r]->read_rest());
    if (r == job.ranks.front())
      ending.outputs.back().insert(ending.outputs.back().begin(), before.begin(), before.end());
  }
  return ending;  // the victim, if it still runs (stopped), is killed with its ChildProcess
}

}  // namespace course
