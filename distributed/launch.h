// launch.h defines: RankInfo and rank_from_environment(), where this process stands in a
// distributed job as PyTorch's launcher (torchrun) tells every process it starts;
// rank_environment(), the same variables for a rank started without the launcher;
// device_identity(), a rank's device as every rank names it; free_tcp_port(),
// a port on this host for a job's rendezvous; join_error(), join_job() and exit_lost_job(), what a
// rank says when it cannot join its job or loses it; and run_local_job(), torchrun in miniature for
// tests of failures: the ranks of a job started on this host, one of them stopped or killed.
#pragma once

#include <c10/core/Device.h>  // defines: c10::Device

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "common/verdict.h"  // defines: CourseError, Verdict

namespace course {

/// Where this process stands in a job, from the variables torchrun sets for every rank.
struct RankInfo {
  int rank = 0;                           ///< RANK: 0 .. world_size - 1, over all hosts
  int world_size = 1;                     ///< WORLD_SIZE: the ranks of the job
  int local_rank = 0;                     ///< LOCAL_RANK: this rank's number on its host
  int local_world_size = 1;               ///< LOCAL_WORLD_SIZE: the ranks on this host
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: the host of the rendezvous' store
  int master_port = 29500;                ///< MASTER_PORT
  bool agent_store = false;  ///< TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store
  int restart_count = 0;     ///< TORCHELASTIC_RESTART_COUNT: how often the job was restarted
};

/// The job this process is a rank of, from its environment: nothing when WORLD_SIZE is unset (a
/// plain run); a UsageError naming the variable when one is missing or out of range.
std::optional<RankInfo> rank_from_environment();

/// What torchrun sets for rank `rank` of a job of `world_size` ranks, all on this host, whose
/// rendezvous is at 127.0.0.1:`port`: "NAME=value" each, for a program that starts ranks itself
/// (rank_from_environment() reads them back).
std::vector<std::string> rank_environment(int rank, int world_size, int port);

/// What names a rank's device across the job's processes: "cpu", or "cuda:N GPU-<uuid>" (the
/// UUID is the same in every process, while N depends on each one's CUDA_VISIBLE_DEVICES).
std::string device_identity(const c10::Device& device);

/// A TCP port on the loopback interface that nobody listens on right now (a rendezvous for ranks
/// started on this host; another program may still take it before they do).
int free_tcp_port();

/// The error of rank `info.rank` that could not join its job (no store at MASTER_ADDR:MASTER_PORT,
/// or the other ranks still missing after the timeout), from what c10d threw: "rank R could not
/// join the job at ADDR:PORT: <why>", with a HINT on starting every rank alike (exit 2).
CourseError join_error(const RankInfo& info, const std::exception& why);

/// What `join` (a rank's rendezvous, then its group's start-up) returns; an error it throws becomes
/// join_error(info, ...), but a CourseError (say, no backend in this build) is thrown as it is.
template <typename Join>
auto join_job(const RankInfo& info, Join&& join) -> decltype(join()) {
  try {
    return join();
  } catch (const CourseError&) {
    throw;
  } catch (const std::exception& e) {
    throw join_error(info, e);
  }
}

/// Ends rank `rank`, whose job was lost during training (a collective failed: another rank died,
/// or stopped answering until the timeout): prints "error: rank R lost the job during training:
/// <why>" and a HINT, checks the claim that every rank finished training as failed in `verdict`,
/// prints its RESULT line for `summary`, and exits with its code (1) at once through std::_Exit,
/// running no destructor: a c10d group whose peer is gone can block in its destructor, and there
/// is nothing left to save.
[[noreturn]] void exit_lost_job(int rank, const std::exception& why, Verdict& verdict,
                                const std::string& summary);

/// A job of ranks on this host, as run_local_job() starts it.
struct LocalJob {
  std::vector<std::string> argv;  ///< the program and its flags, the same for every rank
  int world_size = 2;
  std::vector<int> ranks{0, 1};          ///< the ranks started (the others never arrive)
  int port = 0;                          ///< the rendezvous' port on 127.0.0.1
  std::vector<std::string> environment;  ///< "NAME=value" added to every rank's environment
  int signal = 0;  ///< sent to rank `victim` once it has printed a line holding `after`
  int victim = 1;
  std::string after;
  /// Without a signal: the clock starts once the first rank started prints a line holding
  /// `from` (its rendezvous, say), not at its start, which a busy machine can make slow ("": at
  /// the start). Its lines are in its output all the same.
  std::string from;
  std::chrono::milliseconds deadline{60000};  ///< how long the other ranks may take to end
};
/// How the ranks of a LocalJob ended: every started rank but the victim, in `ranks` order.
struct JobEnding {
  std::vector<int> statuses;                      ///< as waitpid() reports them
  std::vector<std::vector<std::string>> outputs;  ///< their lines, standard error included
  double seconds = 0;  ///< from the start (the signal, or `from`) until the last of them ended
  bool hung = false;   ///< one still ran at the deadline (it was killed then)
};
/// Starts `job.argv` as the ranks `job.ranks` (torchrun's variables from rank_environment()),
/// sends `job.signal` to the victim once it printed `job.after`, and waits for the others.
/// Ranks still running at the end (a stopped victim) are killed.
JobEnding run_local_job(const LocalJob& job);

}  // namespace course
