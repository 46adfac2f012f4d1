// Lesson 24 (going further) — two hosts: lesson 09's job with its ranks on two machines, over a
// network link that is slow next to memory and that can fail while both processes live.
//
// You will learn:
//   - the words of a multi-node job (nodes, a node rank, a rendezvous endpoint: torchrun --nnodes 2
//     --node-rank R --rdzv-endpoint host0:PORT), and that the training loop does not change;
//   - that at 100 Mbit/s a step's all-reduce takes far longer than its arithmetic, and the two
//     levers: fewer all-reduces, more work per all-reduce;
//   - that a cut link ends both ranks with an error within --timeout, and the checkpoint saved
//     before the cut resumes the job, bit for bit.
// The two hosts are made on this machine (hosts.h); that needs root, and is waived (77) without.
//
// Run:    sudo build/bin/lesson24_two_hosts [--quick] [--timeout S] [--data-dir DIR]
// Checks: the job ends with one process's parameters; no all-reduce beats its link, whose share
//         of a step grows as the rate falls; more samples per all-reduce train more a second; a cut
//         ends both ranks within --timeout with exit 1, and the job resumed from the checkpoint
//         ends as the uncut job. Exit 0 PASS, 1 FAIL, 2 bad input, 77 waived (no root).
#include <torch/torch.h>  // defines: torch::optim::Adam, torch::serialize

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/ann.h"               // defines: ANN
#include "common/child_process.h"     // defines: self_executable, describe_status
#include "common/cli.h"               // defines: Cli, CommonOptions, start_lesson
#include "common/compare.h"           // defines: checksum, relative_diff
#include "common/data.h"              // defines: find_fashion_mnist, load_fashion_mnist
#include "common/report.h"            // defines: format
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/timing.h"            // defines: Stopwatch
#include "common/verdict.h"           // defines: Verdict, report_error
#include "distributed/c10d.h"         // defines: CommGroup, shutdown_group
#include "distributed/launch.h"       // defines: RankInfo, rank_from_environment, exit_lost_job
#include "distributed/sampler.h"      // defines: epoch_order, shard_indices
#include "hosts.h"                    // defines: TwoHosts, why_no_hosts
#include "job.h"                      // defines: lesson 17's job (lessons/17_distributed_failures/)
#include "nodes.h"                    // defines: run_on_two_hosts, figures_of, launcher_words
#include "write_atomically.h"         // defines: lesson 13's write_atomically

namespace lesson24 {

using course::ANN;

// ---- knobs --------------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 24;
constexpr int kBatchPerRank = 64;  // lesson 09's
constexpr int kLargeBatch = 512;   // the second lever: more samples per all-reduce
// The job of parts 1 and 3: cut after kCutAfter steps, its rest at 100 Mbit/s (over 5 s, at 30 ms
// a step at the least) leaves the cut time to land mid-training on the busiest machine.
constexpr int kSteps = 200;
constexpr int kRateSteps = 30, kQuickRateSteps = 12;  // each job of part 2
constexpr int kCutAfter = 30;      // part 3 cuts the cable once rank 0 says this step
constexpr int kEvery = 10;         // part 3's ranks save a checkpoint every kEvery steps
constexpr double kSlowGbit = 0.1;  // the link of the levers and of the cut: 100 Mbit/s
const std::vector<double> kRates{0, 10, 1, kSlowGbit};  // Gbit/s; 0: the cable unlimited
constexpr int kTimeoutSeconds = 10;                     // a rank's wait for the others
constexpr int kSlackSeconds = 15;                       // a busy machine: start-up, a late line
// Two hosts against one process: the same sums in another order, compounded by Adam step by step
// (float's own 1e-5 is for one computation: lesson 18 compares what the ranks learn instead).
constexpr double kParameterTolerance = 1e-4;

// ---- as a rank: lesson 09's step, timed; a checkpoint every few steps ---------------------------
struct RankFlags {
  int steps = kSteps;
  int batch = kBatchPerRank;    // samples per rank per step
  std::string buckets = "one";  // "one": one all-reduce a step (lesson 09's); "each": per tensor
  std::string checkpoint;       // saved by rank 0 every --every steps, read back by --resume
  int every = kEvery;
  bool resume = false;
  int timeout_s = kTimeoutSeconds;
  std::string parameters;  // where rank 0 saves its last parameters ("": nowhere)
  std::string program;     // the rank's program: this one ("") or the lesson's binary (its tests)
};

//! [checkpoint]
// The model, Adam's state and the step, written by rank 0 with lesson 13's atomic write: a cut in
// the middle of a save leaves the previous checkpoint whole. Every rank reads it back (here the
// two hosts share one disk; on real machines, a shared file system or a copy on each).
void save_checkpoint(const std::string& path, ANN& model, torch::optim::Adam& adam, int step) {
  torch::serialize::OutputArchive archive, weights, state;
  model->save(weights);
  adam.save(state);
  archive.write("model", weights);
  archive.write("adam", state);
  archive.write("step", torch::tensor(static_cast<std::int64_t>(step)));
  lesson13::write_atomically(path, [&](const lesson13::Sink& sink) { archive.save_to(sink); });
}

int load_checkpoint(const std::string& path, ANN& model, torch::optim::Adam& adam) {
  torch::serialize::InputArchive archive, weights, state;
  archive.load_from(path);
  archive.read("model", weights);
  archive.read("adam", state);
  model->load(weights);
  adam.load(state);
  torch::Tensor step;
  archive.read("step", step);
  return static_cast<int>(step.item<std::int64_t>());
}
//! [checkpoint]

//! [rank-step]
// Lesson 09's loop by steps: step s takes global step s of lesson 09's epochs, so a job resumed at
// step s trains on what the uncut job would have. Prints each step's compute and all-reduce times.
void train_rank(course::CommGroup& group, const course::RankInfo& info, const RankFlags& flags,
                const course::ImageSet& train, std::uint64_t seed, course::Verdict& verdict) {
  const auto timeout = std::chrono::seconds(flags.timeout_s);
  const torch::Device cpu(torch::kCPU);
  torch::manual_seed(seed);
  ANN model;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(lesson17::kLearningRate));
  int first = 0;
  if (flags.resume && std::filesystem::exists(flags.checkpoint)) {
    first = load_checkpoint(flags.checkpoint, model, adam);
    std::printf("rank %d resumes at step %d from %s\n", info.rank, first, flags.checkpoint.c_str());
  }
  lesson17::broadcast_parameters(group, model, timeout);  // DDP's start: rank 0's parameters
  const std::int64_t samples = train.images.size(0), global = info.world_size * flags.batch;
  const std::int64_t per_epoch = samples / global;  // whole steps only: every rank, every step
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  std::vector<double> compute_ms, allreduce_ms;
  torch::Tensor order;  // the epoch's shuffle (DistributedSampler's), drawn as each epoch starts
  for (int step = first; step < flags.steps; ++step) {
    if (step == first || step % per_epoch == 0)
      order = course::epoch_order(samples, seed, step / per_epoch);
    course::Stopwatch watch(cpu);
    const auto idx =
        course::shard_indices(order, step % per_epoch, info.rank, info.world_size, flags.batch);
    adam.zero_grad();
    const torch::Tensor x = train.images.index_select(0, idx),
                        y = train.labels.index_select(0, idx);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y, sum) /
                               static_cast<double>(global);
    loss.backward();
    const double computed = watch.seconds();
    // >>> lab: sum the gradients over the ranks: one all-reduce (lesson 17's), or one per tensor
    if (flags.buckets == "one") {
      lesson17::allreduce_gradients(group, model, timeout);
    } else {
      for (auto& p : model->parameters()) lesson17::allreduce_sum(group, p.mutable_grad(), timeout);
    }
    // <<< lab
    const double reduced = watch.seconds();
    adam.step();  // the same gradients and state on every rank: the same step
    compute_ms.push_back(1e3 * (computed + watch.seconds() - reduced));
    allreduce_ms.push_back(1e3 * (reduced - computed));
    if (info.rank == 0 && !flags.checkpoint.empty() && (step + 1) % flags.every == 0)
      save_checkpoint(flags.checkpoint, model, adam, step + 1);
    if ((step + 1) % 10 == 0 || step + 1 == flags.steps) {
      std::printf("  rank %d step %d/%d  loss %.4f\n", info.rank, step + 1, flags.steps,
                  loss.item<double>() * global / flags.batch);  // this rank's mean
      std::fflush(stdout);
    }
  }
  const double compute = course::median(compute_ms), reduce = course::median(allreduce_ms);
  std::int64_t bytes = 0;  // the gradients', one all-reduce's
  for (const auto& p : model->parameters()) bytes += p.numel() * p.element_size();
  std::printf(
      "rank %d: a step of %d samples a rank: %.3f ms computing, %.3f ms in all-reduce "
      "(%.0f %%) of %lld bytes: %.3f Gbit/s\n",
      info.rank, flags.batch, compute, reduce, 100 * reduce / (compute + reduce),
      static_cast<long long>(bytes), bytes * 8 / (reduce * 1e-3) / 1e9);
  const torch::Tensor flat = torch::nn::utils::parameters_to_vector(model->parameters());
  std::printf("parameter checksum %016llx\n",
              static_cast<unsigned long long>(course::checksum(flat.detach())));
  if (info.rank == 0 && !flags.parameters.empty()) torch::save(flat.detach(), flags.parameters);
  verdict.check(flat.isfinite().all().item<bool>(), "the job trained to its last step");
}
//! [rank-step]

// ---- the ranks' arguments, and one process to compare them with --------------------------------
// One process trained on the global batch, for part 1's comparison.
torch::Tensor one_process(const course::ImageSet& train, int steps, std::uint64_t seed) {
  torch::manual_seed(seed);
  ANN model;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(lesson17::kLearningRate));
  const std::int64_t samples = train.images.size(0), global = 2 * kBatchPerRank;
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor order = course::epoch_order(samples, seed, step / (samples / global));
    const auto idx = course::shard_indices(order, step % (samples / global), 0, 1, global);
    adam.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(train.images.index_select(0, idx)),
                                         train.labels.index_select(0, idx))
        .backward();
    adam.step();
  }
  return torch::nn::utils::parameters_to_vector(model->parameters()).detach();
}

// The job's ranks as `flags` says, one on each host; the arguments every rank gets.
std::vector<std::string> rank_argv(const course::CommonOptions& options, const RankFlags& flags) {
  const std::string program = flags.program.empty() ? course::self_executable() : flags.program;
  std::vector<std::string> argv{program, "--device",  "cpu",        "--threads",
                                "1",     "--buckets", flags.buckets};
  for (const auto& [flag, value] : std::vector<std::pair<std::string, long long>>{
           {"--seed", static_cast<long long>(options.seed)},
           {"--steps", flags.steps},
           {"--batch-size", flags.batch},
           {"--timeout", flags.timeout_s}})
    argv.insert(argv.end(), {flag, std::to_string(value)});
  if (!options.data_dir.empty()) argv.insert(argv.end(), {"--data-dir", options.data_dir});
  if (!flags.checkpoint.empty()) argv.insert(argv.end(), {"--checkpoint", flags.checkpoint});
  if (!flags.parameters.empty()) argv.insert(argv.end(), {"--parameters", flags.parameters});
  if (flags.resume) argv.push_back("--resume");
  return argv;
}

//! [rank-job]
// A rank of the two hosts' job: lesson 17's start (the store at host0, every rank met, the group),
// lesson 09's step; a collective that fails or times out ends the rank with exit 1.
void rank_job(const course::RankInfo& info, const RankFlags& flags, const course::ImageSet& train,
              std::uint64_t seed, course::Verdict& verdict) {
  const torch::Device cpu(torch::kCPU);
  const auto timeout = std::chrono::seconds(flags.timeout_s);
  auto group = lesson17::join_job(info, cpu, timeout);  // prints where the rendezvous is
  try {
    lesson17::connect_group(*group, info, cpu, timeout);
    train_rank(*group, info, flags, train, seed, verdict);
  } catch (const std::exception& e) {  // the link cut, or the other host gone: name it
    const int other = 1 - info.rank;   // the job's other rank, on the other host
    const std::runtime_error lost(
        course::format("no answer from rank %d (host%d): %s", other, other, e.what()));
    course::exit_lost_job(info.rank, lost, verdict, "lesson 24 rank " + std::to_string(info.rank));
  }
  course::shutdown_group(*group);
}
//! [rank-job]

// ---- run plainly: the two hosts, and the job on them --------------------------------------------
// The job on the hosts; each host's lines printed, indented (`all`: all of them, else its figures).
std::vector<NodeEnding> run_job(TwoHosts& hosts, const course::CommonOptions& options,
                                const RankFlags& flags, bool all,
                                const std::string& cut_after = "") {
  TwoHostJob job;
  job.rank_argv = rank_argv(options, flags);
  job.cut_after = cut_after;
  job.timeout_s = flags.timeout_s;
  job.deadline = std::chrono::seconds(3 * flags.timeout_s + 4 * kSlackSeconds);
  std::vector<NodeEnding> endings = run_on_two_hosts(hosts, job);
  for (int h = 0; h < 2; ++h) {
    for (const std::string& line : endings[h].lines) {
      const bool figures = line.find(": a step of ") != std::string::npos ||
                           line.find(" resumes at step ") != std::string::npos;
      if (all || figures || line.rfind("error:", 0) == 0)
        std::printf("  %s> %s\n", TwoHosts::name(h).c_str(), line.c_str());
    }
  }
  std::fflush(stdout);
  return endings;
}

//! [part1]
// Part 1: the job on two hosts, the cable unlimited, against one process with the global batch.
std::string part1(TwoHosts& hosts, const course::CommonOptions& options, RankFlags flags,
                  const course::ImageSet& train, const std::string& folder,
                  course::Verdict& verdict) {
  std::printf("\n== 1. Lesson 09's job on two hosts ==\nOn each host, as on two machines:\n");
  for (int h = 0; h < 2; ++h) std::printf("  %s\n", launcher_words(h).c_str());
  const std::string parameters = folder + "/parameters.pt";
  flags.parameters = parameters;
  const auto endings = run_job(hosts, options, flags, true);
  const StepFigures f0 = figures_of(endings[0]), f1 = figures_of(endings[1]);
  verdict.check(exited(endings[0], 0) && exited(endings[1], 0) && !f0.checksum.empty() &&
                    f0.checksum == f1.checksum,
                "both hosts' ranks end with one set of parameters",
                "checksums " + f0.checksum + " and " + f1.checksum);
  if (!std::filesystem::exists(parameters)) return f0.checksum;
  torch::Tensor two_hosts;
  torch::load(two_hosts, parameters);
  const double apart =
      course::relative_diff(two_hosts, one_process(train, flags.steps, options.seed));
  const double tolerance = kParameterTolerance;
  std::printf("two hosts against one process with the global batch, after %d steps: %.2e apart\n",
              flags.steps, apart);
  verdict.check(apart <= tolerance, "the ranks learn what one process learns",
                course::format("%.2e apart, tolerance %.0e", apart, tolerance));
  return f0.checksum;
}
//! [part1]

//! [part2]
// Part 2: the same step on the cable at each rate: the all-reduce against the arithmetic. Then the
// two levers on the slowest: one all-reduce a step against one per tensor, and 8x the batch.
void part2(TwoHosts& hosts, const course::CommonOptions& options, RankFlags flags,
           course::Verdict& verdict) {
  flags.steps = options.quick ? kQuickRateSteps : kRateSteps;
  std::printf("\n== 2. The link's rate: %d steps a job, medians a step (host0's rank) ==\n",
              flags.steps);
  std::vector<std::pair<std::string, StepFigures>> rows;
  for (const double gbit : kRates) {
    hosts.limit(gbit);
    rows.emplace_back(TwoHosts::rate_name(gbit),
                      figures_of(run_job(hosts, options, flags, false)[0]));
  }
  flags.buckets = "each";
  rows.emplace_back("100mbit, an all-reduce per tensor",
                    figures_of(run_job(hosts, options, flags, false)[0]));
  flags.buckets = "one";
  flags.batch = kLargeBatch;
  rows.emplace_back(course::format("100mbit, %d a rank", kLargeBatch),
                    figures_of(run_job(hosts, options, flags, false)[0]));
  hosts.limit(0);
  std::printf("\n%-34s %9s %10s %11s %6s %10s %9s\n", "link", "step ms", "computing", "all-reduce",
              "share", "Gbit/s", "samples/s");
  for (const auto& [link, f] : rows) {
    const double step = f.compute_ms + f.allreduce_ms;
    std::printf("%-34s %9.3f %10.3f %11.3f %5.0f%% %10.3f %9.0f\n", link.c_str(), step,
                f.compute_ms, f.allreduce_ms, step > 0 ? 100 * f.allreduce_ms / step : 0, f.gbit,
                step > 0 ? 2 * f.batch / (step * 1e-3) : 0);  // 2 ranks' samples a second
  }
  const auto share = [](const StepFigures& f) {
    return f.allreduce_ms / (f.compute_ms + f.allreduce_ms + 1e-12);
  };
  const auto rate = [](const StepFigures& f) {
    return 2 * f.batch / ((f.compute_ms + f.allreduce_ms) * 1e-3 + 1e-12);
  };
  bool ran = true, beaten = false;  // every job said its figures; one beat its link's rate
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const StepFigures& f = rows[i].second;
    ran = ran && f.bytes > 0;
    if (i == 0 || i >= kRates.size()) continue;
    // Each way, the other rank must learn every gradient (its half of the sums, or all of them):
    // the token bucket lets its burst through at once, the rest at the rate. (At 10 Gbit/s the
    // burst holds them all: nothing to check.)
    const double least_ms =
        (f.bytes - TwoHosts::burst_bytes(kRates[i])) * 8 / (kRates[i] * 1e9) * 1e3;
    beaten = beaten || f.allreduce_ms < least_ms;
  }
  verdict.check(ran && !beaten, "every job ran, and no all-reduce beat its link's rate");
  verdict.check(share(rows[3].second) > share(rows[0].second),
                "the all-reduce's share of a step grows as the link slows",
                course::format("%.0f%% at 100mbit, %.0f%% unlimited", 100 * share(rows[3].second),
                               100 * share(rows[0].second)));
  verdict.check(rate(rows[5].second) > rate(rows[3].second),
                course::format("at 100mbit, %dx the samples per all-reduce trains more a second",
                               kLargeBatch / kBatchPerRank),
                course::format("%.0f against %.0f", rate(rows[5].second), rate(rows[3].second)));
}
//! [part2]

//! [part3]
// Part 3: the cable cut mid-training at 100 Mbit/s. Both ranks must end within --timeout with
// exit 1; the last checkpoint loads; mended, the job resumes from it and ends as the uncut one.
void part3(TwoHosts& hosts, const course::CommonOptions& options, RankFlags flags,
           const std::string& uncut, const std::string& folder, course::Verdict& verdict) {
  std::printf("\n== 3. The link cut after step %d (100mbit), --timeout %d s ==\n", kCutAfter,
              flags.timeout_s);
  flags.checkpoint = folder + "/checkpoint.pt";
  hosts.limit(kSlowGbit);
  const auto cut = run_job(hosts, options, flags, false, course::format("step %d/", kCutAfter));
  for (int h = 0; h < 2; ++h) {
    const NodeEnding& e = cut[h];
    const auto said = [&](const std::string& start, const std::string& holds) {
      return std::any_of(e.lines.begin(), e.lines.end(), [&](const std::string& line) {
        return line.rfind(start, 0) == 0 && line.find(holds) != std::string::npos;
      });
    };
    std::printf("  %s: the rank's error %.1f s after the cut; its launcher: %s\n",
                TwoHosts::name(h).c_str(), e.error_after,
                e.hung ? "still waiting on the rendezvous, stopped"
                       : course::describe_status(e.status).c_str());
    // Its verdict line FAIL: the rank exited 1 (the verdict and the exit code agree).
    verdict.check(
        e.error_after >= 0 && e.error_after <= flags.timeout_s + kSlackSeconds &&
            said("error: ", course::format("no answer from rank %d ", 1 - h)) &&
            said("RESULT: FAIL", ""),
        TwoHosts::name(h) + "'s rank ends within --timeout, naming the other, its verdict FAIL");
  }
  hosts.mend();
  hosts.limit(0);
  int saved = -1;
  try {
    torch::manual_seed(options.seed);
    ANN model;
    torch::optim::Adam adam(model->parameters());
    saved = load_checkpoint(flags.checkpoint, model, adam);
  } catch (const std::exception& e) {
    std::printf("  the checkpoint does not load: %s\n", course::error_message(e).c_str());
  }
  verdict.check(saved >= kCutAfter && saved % flags.every == 0,
                "the checkpoint saved before the cut loads", "its step: " + std::to_string(saved));
  flags.resume = true;
  const auto resumed = run_job(hosts, options, flags, false);
  const std::string sum = figures_of(resumed[0]).checksum;
  verdict.check(exited(resumed[0], 0) && exited(resumed[1], 0) && sum == uncut,
                "resumed on the mended link, the job ends as the uncut job",
                "checksums " + sum + " and " + uncut);
}
//! [part3]

}  // namespace lesson24

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson24.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson24;
  course::CommonOptions options;
  options.seed = kSeed;
  RankFlags flags;
  course::Cli cli("lesson24_two_hosts",
                  "Lesson 24: lesson 09's job on two hosts joined by a link that can be slowed "
                  "and cut (run as root). Under torchrun, it is one rank.",
                  options);
  cli.add_data_dir();
  cli.add_option("--timeout", flags.timeout_s, "seconds a rank waits for the other", 1, 3600);
  cli.add_option("--steps", flags.steps, "steps a rank trains", 1, 100000);
  cli.add_option("--batch-size", flags.batch, "samples per rank per step", 1, 30000);
  cli.add_option("--buckets", flags.buckets, "all-reduces a step: one, or each tensor's",
                 {"one", "each"});
  cli.add_hidden_path("--checkpoint", flags.checkpoint);
  cli.add_hidden_path("--parameters", flags.parameters);
  cli.add_flag("--resume", flags.resume, "start from --checkpoint's step");
  if (auto code = cli.parse(argc, argv)) return *code;
  const std::optional<course::RankInfo> job = course::rank_from_environment();
  course::start_lesson(options);  // prints the device first (the ranks train on the CPU)
  course::Verdict verdict;
  if (job) {  // one rank of the job, started on its host
    const course::ImageSet train =
        course::load_fashion_mnist(course::find_fashion_mnist(options.data_dir), /*train=*/true);
    rank_job(*job, flags, train, options.seed, verdict);
    return verdict.finish("lesson 24 rank " + std::to_string(job->rank) + " on " +
                          TwoHosts::name(job->rank));
  }
  const std::string why = why_no_hosts();
  if (!why.empty()) {
    verdict.waive(why);
    return verdict.finish("lesson 24: two hosts");
  }
  const course::ImageSet train =
      course::load_fashion_mnist(course::find_fashion_mnist(options.data_dir), /*train=*/true);
  if (const int stale = remove_stale_hosts())
    std::printf("(removed the hosts of %d earlier run(s) that were killed)\n", stale);
  std::printf("Two hosts on this machine: %s (%s) and %s (%s), one cable between them:\n",
              TwoHosts::name(0).c_str(), TwoHosts::address(0).c_str(), TwoHosts::name(1).c_str(),
              TwoHosts::address(1).c_str());
  TwoHosts hosts;
  const course::TemporaryFolder folder("lesson24-");
  const std::string uncut = part1(hosts, options, flags, train, folder.path().string(), verdict);
  part2(hosts, options, flags, verdict);
  part3(hosts, options, flags, uncut, folder.path().string(), verdict);
  return verdict.finish("lesson 24 on two hosts");
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
