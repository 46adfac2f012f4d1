// launch.h defines: RankInfo and rank_from_environment(), where this process stands in a
// distributed job as PyTorch's launcher (torchrun) tells every process it starts;
// rank_environment(), the same variables for a rank started without the launcher; and
// free_tcp_port(), a port on this host for a job's rendezvous.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace course {

/// Where this process stands in a job, from the variables torchrun sets for every rank.
struct RankInfo {
  int rank = 0;              ///< RANK: 0 .. world_size - 1, over all hosts
  int world_size = 1;        ///< WORLD_SIZE: the ranks of the job
  int local_rank = 0;        ///< LOCAL_RANK: this rank's number on its host
  int local_world_size = 1;  ///< LOCAL_WORLD_SIZE: the ranks on this host
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

/// A TCP port on the loopback interface that nobody listens on right now (a rendezvous for ranks
/// started on this host; another program may still take it before they do).
int free_tcp_port();

}  // namespace course
