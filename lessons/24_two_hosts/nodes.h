// nodes.h defines: a job of two hosts, one rank on each, started as on two real machines: on
// each host, PyTorch's launcher with the words of a multi-node job,
//   torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --rdzv-backend c10d
//            --rdzv-endpoint host0:29400 --no-python PROGRAM ...
// and what each host's rank printed, with when it said it failed.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "hosts.h"  // defines: TwoHosts

namespace lesson24 {

/// The rendezvous' port on host0: each run's hosts are new, so nothing else holds it.
constexpr int kRendezvousPort = 29400;

/// What a job of two hosts runs, and when it is cut.
struct TwoHostJob {
  std::vector<std::string> rank_argv;  ///< the rank's program and its flags, the same on each host
  int timeout_s = 10;                  ///< how long a rank waits for the other
  std::chrono::seconds deadline{120};  ///< from the start: a launcher still running is stopped
  std::string cut_after;  ///< cut the cable once host0's rank prints a line holding this ("": no)
};

/// How one host's launcher ended, and what its rank printed.
struct NodeEnding {
  int status = 0;     ///< the launcher's end, as waitpid() reports it
  bool hung = false;  ///< still running when given up on (the deadline; after a cut, its rank
                      ///< ended and --timeout more): stopped then
  std::vector<std::string> lines;
  double error_after = -1;  ///< seconds from the cut to the rank's "error:" line (-1: none)
};

/// What a rank said of its steps (train_rank's "a step of" line, in two_hosts.cpp) and its
/// parameters' checksum; all zero when it did not say them.
struct StepFigures {
  double compute_ms = 0, allreduce_ms = 0, gbit = 0;
  long long batch = 0, bytes = 0;
  std::string checksum;
};
StepFigures figures_of(const NodeEnding& host);
/// Whether a host's launcher ended by itself with exit `code`.
bool exited(const NodeEnding& host, int code);

/// What torchrun sets for the job's rank on `host` ("NAME=value" each): rank `host` of two, one a
/// host, its store at host0. For a rank started without torchrun.
std::vector<std::string> rank_variables(int host);
/// The launcher's command on `host` (node rank `host`), in a learner's words.
std::string launcher_words(int host);
/// Runs `job` with its rank on each of `hosts`; cuts the cable as `job.cut_after` says. Returns
/// each host's ending, host0 first.
std::vector<NodeEnding> run_on_two_hosts(TwoHosts& hosts, const TwoHostJob& job);

}  // namespace lesson24
