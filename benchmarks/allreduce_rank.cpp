// allreduce_rank: one rank of bench_distributed's all-reduce between two hosts (lesson 24's): a
// process of its own on its host, which joins its job as any rank does (RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT; lesson 09's rendezvous and Gloo group), says "ready", then answers
// each line of its input, a size in bytes, with the seconds one all-reduce of that many bytes took:
// "seconds S". A small all-reduce first starts both ranks' timed one together. It ends at the end
// of its input, and on a collective that fails (exit 1, the error on stderr).
//
// bench_distributed starts it, one on each host, and reads its answers; run by hand it needs a
// second rank: WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bin/allreduce_rank
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "distributed/c10d.h"           // defines: course::shutdown_group
#include "distributed/launch.h"         // defines: course::rank_from_environment
#include "distributed_data_parallel.h"  // defines: lesson09::init_process_group, allreduce_sum

int main() try {
  constexpr std::chrono::milliseconds kTimeout{60000};  // 64 MiB at 100 Mbit/s: 5.4 s
  const auto info = course::rank_from_environment();
  if (!info) {
    std::fprintf(stderr,
                 "error: allreduce_rank is a rank of a job: WORLD_SIZE is not set\n"
                 "HINT: bench_distributed starts it; by hand, set RANK, WORLD_SIZE, MASTER_ADDR "
                 "and MASTER_PORT\n");
    return 2;
  }
  at::set_num_threads(1);  // the sum of two buffers is a small part of the time
  auto group = lesson09::init_process_group(*info, torch::kCPU, kTimeout);
  std::printf("ready\n");
  std::fflush(stdout);
  torch::Tensor start = torch::zeros({1});
  std::map<long long, torch::Tensor> buffers;  // zeros: their sums stay zeros, never inf
  std::string line;
  while (std::getline(std::cin, line)) {
    char* end = nullptr;
    const long long bytes = std::strtoll(line.c_str(), &end, 10);
    if (end == line.c_str() || *end != '\0' || bytes <= 0 || bytes % 4 != 0) {
      std::fprintf(stderr,
                   "error: allreduce_rank read \"%s\", not a size in bytes\n"
                   "HINT: write one size a line, a positive multiple of 4 (floats)\n",
                   line.c_str());
      return 2;
    }
    auto [it, made] = buffers.try_emplace(bytes);
    if (made) it->second = torch::zeros({bytes / 4});
    lesson09::allreduce_sum(*group, start, kTimeout);
    const auto begin = std::chrono::steady_clock::now();
    lesson09::allreduce_sum(*group, it->second, kTimeout);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    std::printf("seconds %.9f\n", seconds);
    std::fflush(stdout);
  }
  course::shutdown_group(*group);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
