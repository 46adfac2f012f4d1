// Lesson 17 (going further) — distributed failures: lesson 09's job when a rank dies, stops, never
// arrives or cannot reach the others: the job ends, every rank with its own error, within
// --timeout, never a hang. Lesson 09's loop and what this lesson adds to it are in job.cpp beside
// this file:
//   - every rank of a host takes its device by one rule, then the ranks agree before they form a
//     group: never a job split between NCCL and Gloo, nor two ranks on one GPU;
//   - the rendezvous waits once, at most --timeout, and says how many ranks arrived; an address
//     nobody serves and a port already taken are errors that say so;
//   - NCCL's wait() returns at once, and a dead peer leaves its kernel waiting until NCCL's
//     watchdog aborts the process: here the host waits with a deadline, then aborts the group;
//   - run plainly, it starts jobs of two ranks (of itself, of lesson 09) and fails one in each way.
// Lesson 18 checks the same job for the failures that raise no error.
// Run:    build/bin/lesson17_distributed_failures [--device ...] [--timeout S] [--data-dir DIR]
//         [--quick]  (the failures, timed)
//         torchrun --no-python --nproc-per-node 2 build/bin/lesson17_distributed_failures  (a job)
// Checks: run plainly, that this lesson's other rank ends with its own error and exit code within
//         --timeout and kSlackSeconds of slack (never a hang), and that a healthy job ends
//         with lesson 09's parameters; as a rank, that the job trained to its end and the model
//         learned (lesson 09's bar after its whole run). Exit 0 PASS, 1 FAIL (or a rank lost), 2
//         bad input.
#include <signal.h>       // defines: SIGKILL, SIGSTOP
#include <torch/torch.h>  // defines: torch::nn, torch::optim

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "common/ann.h"            // defines: ANN, test_accuracy
#include "common/child_process.h"  // defines: describe_status, self_executable
#include "common/cli.h"            // defines: Cli, start_lesson
#include "common/compare.h"        // defines: checksum
#include "common/data.h"           // defines: find_fashion_mnist, load_fashion_mnist_splits
#include "common/device.h"         // defines: cuda_device_count
#include "common/report.h"         // defines: format
#include "common/verdict.h"        // defines: Verdict, CourseError, UsageError, report_error
#include "distributed/c10d.h"      // defines: shutdown_group
#include "distributed/launch.h"    // defines: RankInfo, LocalJob, run_local_job, exit_lost_job
#include "job.h"                   // defines: join_job, train_data_parallel, connect_store

namespace lesson17 {

using course::ANN;

// ---- knobs (the job's own, lesson 09's, are in job.h) -------------------------------------------
// 14: this lesson's number when its GPU runs were recorded, so that a run today repeats them.
constexpr std::uint64_t kSeed = 14;
constexpr double kChance = 0.1;         // ten classes: a model that learned nothing scores this
constexpr double kAccuracyBar = 0.85;   // lesson 09's bar, after kEpochs on all 60,000 images
constexpr int kFailTimeoutSeconds = 5;  // run plainly: the jobs' --timeout
constexpr int kFailEpochs = 50;         // a rank to be killed or stopped is still training then
constexpr int kSlackSeconds = 15;       // a busy machine: a rank ending late, its lines read late
// Run plainly with --quick (the smoke test), the jobs' --timeout: short, as several cases wait a
// whole --timeout; yet enough, as a job's ranks wait for each other only as their start-ups differ.
constexpr int kQuickFailTimeoutSeconds = 3;

// ---- a rank of the job: lesson 09's part 2, ending within --timeout when a rank fails ---------
//! [rank-job]
void rank_job(const course::RankInfo& info, const torch::Device& device,
              const course::ImageSet& train, const course::ImageSet& test, int epochs,
              std::int64_t batch, std::uint64_t seed, std::chrono::milliseconds timeout,
              course::Verdict& verdict) {
  auto group = join_job(info, device, timeout);  // the store, the others met, the group
  ANN model{nullptr};
  try {
    connect_group(*group, info, device, timeout);  // every rank answers a first all-reduce
    model = train_data_parallel(*group, info.rank, info.world_size, train, epochs, batch, device,
                                seed, timeout);
  } catch (const std::exception& e) {  // a peer died (its socket closed) or stopped answering
    course::exit_lost_job(info.rank, e, verdict, "lesson 17 rank " + std::to_string(info.rank));
  }
  course::shutdown_group(*group);  // the last collective is done: end the group in order
  const torch::Tensor parameters =
      torch::nn::utils::parameters_to_vector(model->parameters()).detach();
  std::printf("parameter checksum %016llx\n",
              static_cast<unsigned long long>(course::checksum(parameters)));
  // Here every collective was answered (a rank lost exits above): the job trained to its end.
  const double accuracy = course::test_accuracy(model, test, device);
  if (epochs >= kEpochs && train.images.size(0) >= 60000) {  // lesson 09's whole run
    verdict.check(accuracy >= kAccuracyBar, "the job trained to its end, to lesson 09's bar",
                  course::format("test accuracy %.4f, bar %.2f", accuracy, kAccuracyBar));
  } else {  // a shorter run (--quick, fewer --epochs): it learned something
    verdict.check(accuracy > kChance, "the job trained to its end, better than chance",
                  course::format("test accuracy %.4f", accuracy));
  }
}
//! [rank-job]

// ---- run plainly: jobs of two ranks, one of them failed -----------------------------------------
//! [failures]
// One way to fail a job of two ranks, and how this lesson's other rank must end: counted from the
// signal (or its rendezvous), after 0.5 x waits x --timeout; a failure by max(1, waits) x --timeout
// + slack.
struct Failure {
  const char* what;        // the case, as printed
  std::vector<int> ranks;  // the ranks started: a rank left out never arrives
  int signal;              // sent to rank 1 once it trained an epoch (0: none)
  int code;                // the exit code of every rank started, but the one signalled
  int gpus;                // GPUs the job needs (0: CPU ranks, Gloo; else NCCL, --device cuda)
  double waits;            // the time window's start, in --timeouts
  const char* says;        // in the first of those ranks' error line (or its checksum line)
  const char* env;         // "NAME=value" for every rank ("": none)
};
const std::vector<Failure> kFailures{
    // what, ranks, signal, code, gpus, waits, says, env
    {"both ranks train: a healthy job", {0, 1}, 0, 0, 0, 0, "parameter checksum", ""},
    {"rank 1 killed (SIGKILL) after an epoch", {0, 1}, SIGKILL, 1, 0, 0, "lost the job", ""},
    {"rank 1 stopped (SIGSTOP) after an epoch", {0, 1}, SIGSTOP, 1, 0, 1, "lost the job", ""},
    {"rank 1 never starts", {0}, 0, 2, 0, 1, "1 of 2 arrived", ""},
    {"rank 0 never starts: no store", {1}, 0, 2, 0, 1, "cannot reach the rendezvous", ""},
    {"the rendezvous' port is taken", {0}, 0, 2, 0, 0, "is in use", ""},
    {"NCCL: rank 1 killed after an epoch", {0, 1}, SIGKILL, 1, 2, 0, "lost the job", ""},
    {"NCCL: two ranks on GPU 0", {0, 1}, 0, 2, 1, 0, "share one GPU", "CUDA_VISIBLE_DEVICES=0"}};
//! [failures]

//! [fail-ranks]
// `program` as a job of two ranks on this host, failed as `failure` says: how the other ranks end,
// and the first line of the first of them that says what happened.
std::pair<course::JobEnding, std::string> run_job(const std::string& program,
                                                  const Failure& failure,
                                                  const std::vector<std::string>& flags,
                                                  int timeout_s) {
  course::LocalJob job;
  job.argv = flags;  // on the CPU (Gloo) unless the job needs GPUs, whatever --device says
  job.argv.insert(job.argv.begin(), {program, "--quick", "--timeout", std::to_string(timeout_s),
                                     "--device", failure.gpus > 0 ? "cuda" : "cpu"});
  job.ranks = failure.ranks;
  job.port = course::free_tcp_port();
  if (failure.signal != 0)
    job.argv.insert(job.argv.end(), {"--epochs", std::to_string(kFailEpochs)});
  if (failure.env[0] != '\0') job.environment.emplace_back(failure.env);  // not ""
  job.signal = failure.signal;
  job.after = "epoch 1/";
  job.from = "(local rank ";  // in the line a rank of 09 or 17 prints as it goes to the rendezvous
  job.deadline = std::chrono::seconds(2 * timeout_s + 4 * kSlackSeconds);  // then: hung
  course::RankInfo r0;  // a rank 0's store on the port first: it is no longer free
  r0.master_port = job.port;
  c10::intrusive_ptr<c10d::Store> taken;
  if (std::string(failure.says) == "is in use") taken = connect_store(r0, std::chrono::seconds(5));
  const course::JobEnding ending = course::run_local_job(job);
  for (const std::string& line : ending.outputs.at(0)) {
    if (line.rfind("error:", 0) == 0 || line.rfind("parameter checksum", 0) == 0)
      return {ending, line};
  }
  return {ending, ""};
}

// Each failure in a job of lesson 09 (if beside this program) and of this lesson; a process a
// rank, a thread each.
void fail_ranks(const std::string& device, const std::string& data_dir, int timeout_s,
                std::uint64_t seed, course::Verdict& verdict) {
  const std::string here = course::self_executable();
  const std::string lesson09 =
      (std::filesystem::path(here).parent_path() / "lesson09_data_parallel").string();
  const bool have09 = std::filesystem::exists(lesson09);
  std::vector<std::string> flags{"--seed", std::to_string(seed), "--threads", "1"};
  if (!data_dir.empty()) flags.insert(flags.end(), {"--data-dir", data_dir});
  std::printf("Jobs of 2 ranks on this host, --quick --threads 1 --timeout %d%s\n", timeout_s,
              have09 ? "" : " (no lesson 09 beside this program)");
  for (const Failure& f : kFailures) {
    std::printf("\n-- %s\n", f.what);
    std::fflush(stdout);  // all printed so far (std::cout writes through stdout): a stopped run
    if (f.gpus > 0 && (device == "cpu" || course::cuda_device_count() < f.gpus)) {
      std::printf("   (skipped: needs %d GPU(s), --device cuda)\n", f.gpus);
      continue;
    }
    std::string said09, said17;  // what lesson 09's and this lesson's first rank said
    for (const bool as09 : {true, false}) {
      if (as09 && !have09) continue;
      const auto [e, line] = run_job(as09 ? lesson09 : here, f, flags, timeout_s);
      std::printf("   lesson %s: %s%s after %.1f s: %s\n", as09 ? "09" : "17",
                  e.hung ? "HUNG, " : "", course::describe_status(e.statuses.front()).c_str(),
                  e.seconds,
                  line.size() > 100 ? (line.substr(0, 97) + "...").c_str() : line.c_str());
      std::fflush(stdout);
      // Enough for "parameter checksum " and its 16 digits.
      if (as09) {
        said09 = line.substr(0, 35);
        continue;
      }
      said17 = line.substr(0, 35);
      const bool ended = !e.hung && std::all_of(e.statuses.begin(), e.statuses.end(), [&](int s) {
        return WIFEXITED(s) && WEXITSTATUS(s) == f.code;
      });
      const double waited = e.seconds / timeout_s;  // no sooner than its wait, never much later
      verdict.check(
          ended && line.find(f.says) != std::string::npos && waited >= 0.5 * f.waits &&
              (f.code == 0 || e.seconds <= std::max(1.0, f.waits) * timeout_s + kSlackSeconds),
          std::string(f.what) + ": exit " + std::to_string(f.code) + ", \"" + f.says + "\"");
    }
    if (f.code == 0 && have09)
      verdict.check(said09 == said17, "the same parameters as lesson 09's");
  }
}
//! [fail-ranks]

}  // namespace lesson17

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson17.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson17;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0, batch = kBatchPerRank, timeout_s = 0;  // 0: the defaults below
  course::Cli cli("lesson17_distributed_failures",
                  "Lesson 17: lesson 09's job when ranks fail. Run plainly, it fails ranks of jobs "
                  "it starts and times how the others end; under torchrun, it is one rank.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs, as a rank (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch, "samples per rank per step", 1, 60000);
  cli.add_option("--timeout", timeout_s,
                 "seconds to wait for a rank (0: 120; run plainly 5, 3 if quick)", 0, 86400);
  if (auto code = cli.parse(argc, argv)) return *code;

  const std::optional<course::RankInfo> job = course::rank_from_environment();
  // One rank per device, by one rule on every rank; the host's cores shared out.
  const std::string reason = job ? take_rank_device(options, *job) : "";
  const torch::Device device = course::start_lesson(options);  // prints the device first
  if (!reason.empty()) std::cout << "(" << reason << ")\n";
  course::find_fashion_mnist(options.data_dir);  // every rank reads it: said at once if missing
  course::Verdict verdict;
  if (timeout_s == 0)
    timeout_s = job             ? kTimeoutSeconds
                : options.quick ? kQuickFailTimeoutSeconds
                                : kFailTimeoutSeconds;
  if (!job) {  // run plainly: the failures, measured
    fail_ranks(device.is_cuda() ? "cuda" : "cpu", options.data_dir, timeout_s, options.seed,
               verdict);
    return verdict.finish("lesson 17 on " + device.str());
  }
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? 1 : kEpochs;
  rank_job(*job, device, train, test, epochs, batch, options.seed, std::chrono::seconds(timeout_s),
           verdict);
  return verdict.finish("lesson 17 rank " + std::to_string(job->rank) + " of " +
                        std::to_string(job->world_size) + " on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
