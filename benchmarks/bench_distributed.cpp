// bench_distributed: lesson 09's collectives and step on real c10d groups. Each benchmark thread
// is one rank (Gloo ranks talk over TCP loopback, as two processes on one host would; NCCL ranks
// each drive their own GPU):
//   - all-reduce time and bandwidth against message size, 4 KiB .. 64 MiB (Gloo on the CPU; NCCL
//     on the GPUs). algbw = bytes / time; busbw = algbw * 2(n-1)/n, the link traffic a ring
//     all-reduce needs, comparable across world sizes (nccl-tests' convention);
//   - lesson 09's training step (batch 64 per rank, the gradients' bucket all-reduced) for world
//     size 1 against 2. On the CPU each rank gets one core, so the two worlds use 1 and 2 cores;
//   - the all-reduce between two hosts (lesson 24's, made on this machine; needs root): a rank
//     process on each (allreduce_rank), over the cable between them unlimited and limited to
//     10 Gbit/s, 1 Gbit/s and 100 Mbit/s each way, against message size.
//
// Run: build/bin/bench_distributed --benchmark_out=distributed.json --benchmark_out_format=json
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "bench.h"
#include "common/child_process.h"  // defines: ChildProcess, self_executable
#include "common/cli.h"            // defines: available_cores
#include "common/device.h"
#include "common/report.h"   // defines: format
#include "common/verdict.h"  // defines: CourseError
#include "hosts.h"           // defines: lesson 24's TwoHosts (lessons/24_two_hosts/)
#include "nodes.h"           // defines: its kRendezvousPort

// The lesson is one file with its own main(); the benchmark includes it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "data_parallel.cpp"

namespace {

constexpr std::chrono::milliseconds kTimeout{120000};  // a collective that waits this long failed

// One group per benchmark run, shared by its threads: the threads of a run meet in one
// HashStore under a prefix of their own. Runs follow each other, and every thread of a run with
// n threads counts once in the counter of n, so calls / n numbers the runs with n threads.
c10::intrusive_ptr<course::CommGroup> group_for(benchmark::State& state,
                                                const torch::Device& device) {
  static auto store = c10::make_intrusive<c10d::HashStore>();
  static std::array<std::atomic<int>, 64> calls{};
  const int world = state.threads();
  const int run = calls.at(world)++ / world;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "world" + std::to_string(world) + "/run" + std::to_string(run), store);
  return lesson09::make_group(prefixed, state.thread_index(), world, device, kTimeout);
}

// The device of this thread's rank, or false (and the run skipped) when there is none.
bool rank_device(benchmark::State& state, bool cuda, torch::Device& device) {
  if (cuda) {
    if (course::cuda_device_count() < state.threads()) {
      state.SkipWithError(
          ("needs " + std::to_string(state.threads()) +
           " GPU(s): " + (course::cuda_device_count() > 0 ? "fewer found" : course::why_no_cuda()))
              .c_str());
      return false;
    }
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(state.thread_index()));
  } else {
    device = torch::kCPU;
  }
  return true;  // a build without the device's backend: make_group says so, and the run is skipped
}

// Every rank must make the same number of calls (each is a collective), so the count per clock
// read is fixed rather than calibrated by each rank on its own: several on a GPU, where one call
// per synchronize would time the synchronize.
int calls_per_sync(const torch::Device& device) { return device.is_cuda() ? 16 : 1; }

// Runs a benchmark body; a c10d error (a group that cannot form, a backend this build has not got)
// ends the run with its message.
void guarded(benchmark::State& state, void (*body)(benchmark::State&, bool), bool cuda) {
  try {
    body(state, cuda);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---- all-reduce against message size ------------------------------------------------------------
void allreduce(benchmark::State& state, bool cuda) {
  torch::Device device(torch::kCPU);
  if (!rank_device(state, cuda, device)) return;
  auto group = group_for(state, device);
  const std::int64_t bytes = state.range(0);
  torch::Tensor buffer = torch::ones({bytes / 4}, torch::TensorOptions().device(device));
  bench::run_timed(
      state, device, [&] { lesson09::allreduce_sum(*group, buffer, kTimeout); },
      calls_per_sync(device));
  if (!cuda) state.SetLabel("loopback");  // the ranks' TCP never leaves this host's memory
  // Bytes per second, averaged over the ranks (each rank reduces the same buffer).
  const int n = state.threads();
  const auto per_rank = benchmark::Counter::Flags(benchmark::Counter::kIsIterationInvariantRate |
                                                  benchmark::Counter::kAvgThreads);
  state.counters["algbw"] =
      benchmark::Counter(static_cast<double>(bytes), per_rank, benchmark::Counter::kIs1024);
  state.counters["busbw"] = benchmark::Counter(static_cast<double>(bytes) * 2.0 * (n - 1) / n,
                                               per_rank, benchmark::Counter::kIs1024);
}
void BM_AllreduceGloo(benchmark::State& state) { guarded(state, allreduce, false); }
void BM_AllreduceNccl(benchmark::State& state) { guarded(state, allreduce, true); }

// ---- lesson 09's step: world size 1 against 2 ------------------------------------------------
void step(benchmark::State& state, bool cuda) {
  torch::Device device(torch::kCPU);
  if (!rank_device(state, cuda, device)) return;
  if (!cuda) at::set_num_threads(1);  // one core per rank
  auto group = group_for(state, device);
  const std::int64_t batch = state.range(0);
  lesson09::ANN model;
  model->to(device);
  lesson09::broadcast_parameters(*group, model->parameters(), kTimeout);
  torch::optim::Adam optimizer(model->parameters(),
                               torch::optim::AdamOptions(lesson09::kLearningRate));
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor images = torch::rand({batch, 784}, on);
  const torch::Tensor labels = torch::randint(10, {batch}, on.dtype(torch::kLong));
  bench::run_timed(
      state, device,
      [&] {
        optimizer.zero_grad();
        torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
        lesson09::allreduce_gradients(*group, model->parameters(), kTimeout);
        optimizer.step();
      },
      calls_per_sync(device));
  // Samples per second of the whole job: every rank takes `batch` samples per step.
  state.counters["job_samples/s"] =
      benchmark::Counter(static_cast<double>(batch * state.threads()),
                         benchmark::Counter::Flags(benchmark::Counter::kIsIterationInvariantRate |
                                                   benchmark::Counter::kAvgThreads));
  if (!cuda) at::set_num_threads(course::available_cores());
}
void BM_StepGloo(benchmark::State& state) { guarded(state, step, false); }
void BM_StepNccl(benchmark::State& state) { guarded(state, step, true); }

// ---- all-reduce between two hosts ------------------------------------------------------------
// A rank on each of lesson 24's two hosts, each a process of its own (allreduce_rank, beside this
// program) whose TCP crosses the cable between the hosts. Made at the first case that needs them,
// kept for every case after (the cable's rate is changed under the same ranks), removed at exit.
// TwoHosts prints the commands that make and limit the hosts, so they are in the program's output.
class RanksOnTwoHosts {
 public:
  explicit RanksOnTwoHosts(const std::string& program) {
    for (int h = 0; h < 2; ++h) {
      ranks_[h] = std::make_unique<course::ChildProcess>(hosts_.on(h, {program}),
                                                         lesson24::rank_variables(h),
                                                         /*with_stderr=*/true,
                                                         /*with_stdin=*/true);
    }
    for (int h = 0; h < 2; ++h) answer(h, "ready");
  }
  ~RanksOnTwoHosts() {
    for (auto& rank : ranks_) rank->close_input();  // each rank ends at the end of its input
    for (auto& rank : ranks_) rank->wait_for(std::chrono::seconds(10));
  }
  RanksOnTwoHosts(const RanksOnTwoHosts&) = delete;
  RanksOnTwoHosts& operator=(const RanksOnTwoHosts&) = delete;

  /// The cable limited to `mbit` Mbit/s each way (0: unlimited).
  void limit(std::int64_t mbit) {
    if (mbit != mbit_) hosts_.limit(static_cast<double>(mbit) / 1000);
    mbit_ = mbit;
  }
  /// Seconds one all-reduce of `bytes` took: the slower rank's time, as the collective ends for
  /// the job when it has ended on every rank. Throws, naming the host, when a rank fails.
  double allreduce(std::int64_t bytes) {
    for (int h = 0; h < 2; ++h) {
      try {
        ranks_[h]->write_line(std::to_string(bytes));
      } catch (const std::runtime_error&) {
        ended(h);  // it no longer reads its input
      }
    }
    double seconds = 0;
    for (int h = 0; h < 2; ++h) {
      const std::string said = answer(h, "seconds ");
      char* end = nullptr;
      const double taken = std::strtod(said.c_str(), &end);
      if (end == said.c_str() || *end != '\0')
        throw std::runtime_error(course::format("the rank on %s answered \"seconds %s\"",
                                                lesson24::TwoHosts::name(h).c_str(), said.c_str()));
      seconds = std::max(seconds, taken);
    }
    return seconds;
  }
  /// Whether this is the first all-reduce of `bytes` at `mbit`: the ones after need no warm-up.
  bool first(std::int64_t mbit, std::int64_t bytes) { return warmed_.insert({mbit, bytes}).second; }

 private:
  // What rank `h` said after `word` on its next line that starts with it; its other lines
  // (warnings) are kept for the error it throws when its output ends first.
  std::string answer(int h, const std::string& word) {
    std::string line, said;
    while (ranks_[h]->read_line(line)) {
      if (line.rfind(word, 0) == 0) return line.substr(word.size());
      said += "\n  " + line;
    }
    ended(h, said);
  }
  // Throws the error of rank `h`, which ended: how, and what it said (`said`, then the rest).
  [[noreturn]] void ended(int h, std::string said = "") {
    for (const std::string& line : ranks_[h]->read_rest()) said += "\n  " + line;
    throw std::runtime_error(
        course::format("the rank on %s ended (%s):%s", lesson24::TwoHosts::name(h).c_str(),
                       course::describe_status(ranks_[h]->kill()).c_str(), said.c_str()));
  }

  lesson24::TwoHosts hosts_;
  std::unique_ptr<course::ChildProcess> ranks_[2];
  std::int64_t mbit_ = 0;
  std::set<std::pair<std::int64_t, std::int64_t>> warmed_;
};

// The ranks every case of BM_AllreduceTwoHosts uses, made by the first: nullptr with the reason
// when they cannot be had, or after a case failed with them (a rank's answer may then be
// pending, and the next case would read it as its own).
struct TwoHostRanks {
  std::unique_ptr<RanksOnTwoHosts> ranks;
  std::string why;  // "" while they can be used
};
TwoHostRanks& two_host_ranks() {
  static TwoHostRanks made = [] {
    TwoHostRanks r;
    r.why = lesson24::why_no_hosts();
    const std::string program =
        (std::filesystem::path(course::self_executable()).parent_path() / "allreduce_rank")
            .string();
    if (r.why.empty() && !std::filesystem::exists(program))
      r.why = "no " + program + " (HINT: build the allreduce_rank target: scripts/build.sh does)";
    if (!r.why.empty()) return r;
    try {
      lesson24::remove_stale_hosts();  // of a run that was killed
      r.ranks = std::make_unique<RanksOnTwoHosts>(program);
    } catch (const course::CourseError& e) {
      r.why = std::string(e.what()) + " (HINT: " + e.hint() + ")";
    } catch (const std::exception& e) {
      r.why = e.what();
    }
    return r;
  }();
  return made;
}

void BM_AllreduceTwoHosts(benchmark::State& state) {
  TwoHostRanks& two = two_host_ranks();
  if (!two.ranks) {
    state.SkipWithError(("needs two hosts: " + two.why).c_str());
    return;
  }
  const std::int64_t mbit = state.range(0), bytes = state.range(1);
  try {
    two.ranks->limit(mbit);
    // Warm-up, once a case: the ranks' buffer made, the connection's window grown.
    if (two.ranks->first(mbit, bytes)) two.ranks->allreduce(bytes);
    for (auto _ : state) state.SetIterationTime(two.ranks->allreduce(bytes));
  } catch (const std::exception& e) {
    two.ranks.reset();  // the ranks ended, the hosts removed: the cases after skip
    two.why = std::string("an earlier case failed: ") + e.what();
    state.SkipWithError(e.what());
    return;
  }
  state.SetLabel(lesson24::TwoHosts::rate_name(static_cast<double>(mbit) / 1000));
  // Two ranks: busbw = algbw (each rank sends and receives the message's size, once each way).
  const auto rate = benchmark::Counter::kIsIterationInvariantRate;
  state.counters["algbw"] =
      benchmark::Counter(static_cast<double>(bytes), rate, benchmark::Counter::kIs1024);
  state.counters["busbw"] =
      benchmark::Counter(static_cast<double>(bytes), rate, benchmark::Counter::kIs1024);
  state.counters["bits_per_second"] = benchmark::Counter(static_cast<double>(bytes) * 8, rate);
}

void message_sizes(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes");
  for (std::int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) b->Arg(bytes);
}

void rates_and_sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mbit", "bytes"});
  for (std::int64_t mbit : {0, 10000, 1000, 100}) {
    for (std::int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) b->Args({mbit, bytes});
  }
}

}  // namespace

BENCHMARK(BM_AllreduceGloo)->Apply(message_sizes)->Threads(2)->UseManualTime();
BENCHMARK(BM_AllreduceNccl)->Apply(message_sizes)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(BM_StepGloo)->ArgName("batch")->Arg(64)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(BM_StepNccl)->ArgName("batch")->Arg(64)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(BM_AllreduceTwoHosts)->Apply(rates_and_sizes)->UseManualTime();
