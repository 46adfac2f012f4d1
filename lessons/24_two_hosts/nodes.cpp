// nodes.cpp: each host's launcher started in its namespace, its lines read as they come (a thread
// a host), the cable cut at the line asked for.
#include "nodes.h"

#include <signal.h>         // SIGTERM
#include <sys/wait.h>       // WIFEXITED
#include <torch/version.h>  // defines: TORCH_VERSION_MAJOR

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/child_process.h"  // defines: ChildProcess

// The Python whose torch is this LibTorch (its torchrun), from the build.
#ifndef LESSON24_PYTHON
#define LESSON24_PYTHON ""
#endif

namespace lesson24 {
namespace {

using Clock = std::chrono::steady_clock;

// PyTorch 2's torchrun. LibTorch 1.13's own (Debian's python3-torch) cannot start a worker under
// Python 3.11 (its redirect setting parses to None), so there each host starts its rank with the
// variables torchrun would give it, and the words are printed all the same.
// (Without a Python of this LibTorch's, the same.)
constexpr bool kTorchrun = TORCH_VERSION_MAJOR >= 2 && LESSON24_PYTHON[0] != '\0';

std::vector<std::string> torchrun_flags(int host) {
  return {"--nnodes",         "2",
          "--nproc-per-node", "1",
          "--node-rank",      std::to_string(host),
          "--rdzv-backend",   "c10d",
          "--rdzv-endpoint",  TwoHosts::name(0) + ":" + std::to_string(kRendezvousPort),
          "--rdzv-id",        "lesson24",
          "--max-restarts",   "0"};
}

// One host's launcher, and the lines it prints, each with when it came.
class Node {
 public:
  Node(const std::vector<std::string>& argv, const std::vector<std::string>& environment)
      : process_(argv, environment, /*with_stderr=*/true), reader_([this] { read(); }) {}
  ~Node() {
    if (!ended_) stop();
    reader_.join();  // the output ends once the launcher and its rank have
  }

  // Waits until a line holds `text` (true), or the output ends or `until` passes (false).
  bool wait_for_line(const std::string& text, Clock::time_point until) {
    std::unique_lock<std::mutex> lock(mutex_);
    std::size_t seen = 0;
    while (true) {
      for (; seen < lines_.size(); ++seen)
        if (lines_[seen].second.find(text) != std::string::npos) return true;
      if (done_ || !changed_.wait_until(lock, until, [&] { return done_ || seen < lines_.size(); }))
        return false;
    }
  }
  // Waits for the launcher to end until `until`; stops it then (hung).
  NodeEnding end(Clock::time_point until, std::optional<Clock::time_point> cut) {
    NodeEnding ending;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    std::optional<int> status = process_.wait_for(std::max(left, std::chrono::milliseconds(0)));
    ending.hung = !status;
    if (!status) status = stop();
    ended_ = true;
    ending.status = *status;
    std::unique_lock<std::mutex> lock(mutex_);  // the rest of its output, for at most 10 s more
    changed_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; });
    for (const auto& [when, line] : lines_) {
      ending.lines.push_back(line);
      if (cut && ending.error_after < 0 && line.rfind("error:", 0) == 0)
        ending.error_after = std::chrono::duration<double>(when - *cut).count();
    }
    return ending;
  }

 private:
  void read() {
    std::string line;
    while (process_.read_line(line)) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.emplace_back(Clock::now(), line);
      changed_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    changed_.notify_all();
  }
  // torchrun stops its rank on SIGTERM; what still runs after 5 s is killed.
  int stop() {
    process_.signal(SIGTERM);
    if (auto status = process_.wait_for(std::chrono::seconds(5))) return *status;
    return process_.kill();
  }

  course::ChildProcess process_;
  bool ended_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::pair<Clock::time_point, std::string>> lines_;
  bool done_ = false;
  std::thread reader_;  // last: it starts once the members above exist
};

}  // namespace

StepFigures figures_of(const NodeEnding& host) {
  StepFigures f;
  for (const std::string& line : host.lines) {
    int rank = 0;
    double share = 0;
    char sum[17] = {};
    std::sscanf(line.c_str(),
                "rank %d: a step of %lld samples a rank: %lf ms computing, %lf ms in all-reduce "
                "(%lf %%) of %lld bytes: %lf Gbit/s",
                &rank, &f.batch, &f.compute_ms, &f.allreduce_ms, &share, &f.bytes, &f.gbit);
    if (std::sscanf(line.c_str(), "parameter checksum %16s", sum) == 1) f.checksum = sum;
  }
  return f;
}

bool exited(const NodeEnding& host, int code) {
  return !host.hung && WIFEXITED(host.status) && WEXITSTATUS(host.status) == code;
}

std::string launcher_words(int host) {
  std::string words = TwoHosts::name(host) + "$ torchrun";
  for (const std::string& flag : torchrun_flags(host)) words += " " + flag;
  return words + " --no-python PROGRAM ...";
}

std::vector<std::string> rank_variables(int host) {
  return {"RANK=" + std::to_string(host),
          "WORLD_SIZE=2",
          "LOCAL_RANK=0",
          "LOCAL_WORLD_SIZE=1",
          "GROUP_RANK=" + std::to_string(host),
          "MASTER_ADDR=" + TwoHosts::name(0),
          "MASTER_PORT=" + std::to_string(kRendezvousPort)};
}

std::vector<NodeEnding> run_on_two_hosts(TwoHosts& hosts, const TwoHostJob& job) {
  const auto start = Clock::now(), until = start + job.deadline;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int host = 0; host < 2; ++host) {
    std::vector<std::string> argv, environment;
    if (kTorchrun) {
      argv = {LESSON24_PYTHON, "-m", "torch.distributed.run"};  // what the torchrun script runs
      const auto flags = torchrun_flags(host);
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.push_back("--no-python");
    } else {
      environment = rank_variables(host);
    }
    argv.insert(argv.end(), job.rank_argv.begin(), job.rank_argv.end());
    nodes.push_back(std::make_unique<Node>(hosts.on(host, argv), environment));
  }
  std::optional<Clock::time_point> cut;
  if (!job.cut_after.empty() && nodes[0]->wait_for_line(job.cut_after, until)) {
    hosts.cut();
    cut = Clock::now();
  }
  std::vector<NodeEnding> endings;
  for (auto& node : nodes) {
    // After a cut, once its rank has ended (its verdict line), a launcher gets --timeout more to
    // end: torchrun's agent on host1 also waits on the rendezvous' store, across the cut cable.
    auto limit = until;
    if (cut && node->wait_for_line("RESULT: ", until))
      limit = std::min(until, Clock::now() + std::chrono::seconds(job.timeout_s));
    endings.push_back(node->end(limit, cut));
  }
  return endings;
}

}  // namespace lesson24
