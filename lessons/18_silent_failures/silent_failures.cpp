// Lesson 18 (going further) — silent failures: lesson 09's job when nothing fails with an error,
// yet the ranks train something else than one process would. Lesson 17's job (its job.cpp: lesson
// 09's loop, its collectives with a deadline) as it is, with a check at each step for each such
// failure:
//   1. a gradient not summed over the ranks: the summed gradient against one process's over the
//      global batch, for the first steps;
//   2. ranks drifting apart: every rank's parameters against rank 0's, bit for bit, at every step
//      and at the end;
//   3. a job that learns something else: its loss and accuracy against one process's, trained with
//      the global batch.
// Run:    torchrun --no-python --nproc-per-node 2 build/bin/lesson18_silent_failures  (a job)
//         build/bin/lesson18_silent_failures [--quick]  (starts such a job of 2 CPU ranks itself)
// Checks: as a rank, each silent failure's check; run plainly, that both ranks of the job it starts
//         pass. Exit 0 PASS, 1 FAIL (or a rank lost), 2 bad input.
#include <torch/torch.h>  // defines: torch::nn, torch::autograd

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <torch/csrc/distributed/c10d/HashStore.hpp>  // defines: c10d::HashStore (a group of one)
#include <vector>

#include "common/ann.h"            // defines: ANN, test_accuracy
#include "common/child_process.h"  // defines: self_executable
#include "common/cli.h"            // defines: Cli, CommonOptions, start_lesson
#include "common/compare.h"        // defines: relative_diff, tolerance_for, checksum, gradients
#include "common/data.h"           // defines: find_fashion_mnist, load_fashion_mnist_splits
#include "common/verdict.h"        // defines: Verdict, report_error
#include "distributed/c10d.h"      // defines: CommGroup, shutdown_group
#include "distributed/launch.h"    // defines: RankInfo, LocalJob, run_local_job, exit_lost_job
#include "job.h"                   // defines: lesson 17's job (lessons/17_distributed_failures/)

namespace lesson18 {

using course::ANN;
using lesson17::kBatchPerRank;  // the job's knobs: lesson 09's epochs and batch, a rank's wait
using lesson17::kEpochs;
using lesson17::kQuickSamples;
using lesson17::kTimeoutSeconds;
using lesson17::make_group;
using lesson17::StepCheck;
using lesson17::train_data_parallel;
using lesson17::wait_within;

// ---- knobs --------------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 18;  // (the job's own knobs, lesson 09's, are lesson 17's job.h)
constexpr int kCheckedSteps = 5;     // the summed gradient against one process's, for these steps
// The ranks against one process with the global batch: by what they learn (parameters drift).
constexpr double kLossMargin = 0.02;      // final epoch's loss, relative
constexpr double kAccuracyMargin = 0.01;  // test accuracy, absolute

// ---- the checks: lesson 09's loop, checked at each step -----------------------------------------
// One process's gradient over `indices` (a global step's samples, every rank's) from the model's
// parameters, as the ranks' losses add up to it; the model's own gradients are left as they are.
torch::Tensor gradient_of_global_batch(ANN& model, const course::ImageSet& train,
                                       const torch::Tensor& indices, const torch::Device& device) {
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  const torch::Tensor x = train.images.index_select(0, indices).to(device);
  const torch::Tensor y = train.labels.index_select(0, indices).to(device);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y, sum) /
                             static_cast<double>(x.size(0));
  return torch::nn::utils::parameters_to_vector(torch::autograd::grad({loss}, model->parameters()));
}

struct RankRun {
  ANN model{nullptr};
  std::vector<double> losses;          // each epoch's mean loss over every rank's samples
  std::vector<double> gradient_diffs;  // the first kCheckedSteps steps: summed vs one process's
  torch::Tensor trail;  // the parameters' bits at every step, summed: equal on equal ranks
};

//! [train-checked]
// Lesson 09's loop as it is, with this lesson's checks at each step.
RankRun train_checked(course::CommGroup& group, int rank, int world_size,
                      const course::ImageSet& train, int epochs, std::int64_t batch_per_rank,
                      const torch::Device& device, std::uint64_t seed,
                      std::chrono::milliseconds timeout) {
  RankRun run{nullptr, {}, {}, torch::zeros({}, torch::dtype(torch::kLong).device(device))};
  const StepCheck check = [&](ANN& model, const torch::Tensor& global) {
    if (run.gradient_diffs.size() < kCheckedSteps) {  // silent failure 1: a gradient not summed
      const torch::Tensor summed =
          torch::nn::utils::parameters_to_vector(course::gradients(model->parameters()));
      run.gradient_diffs.push_back(
          course::relative_diff(summed, gradient_of_global_batch(model, train, global, device)));
    }
    // Silent failure 2, ranks apart: the bits of the parameters the gradients came from (no sync).
    for (const auto& p : model->parameters())
      run.trail += p.detach().view(torch::kInt).sum(torch::kLong);
  };
  run.model = train_data_parallel(group, rank, world_size, train, epochs, batch_per_rank, device,
                                  seed, timeout, &run.losses, check);
  return run;
}
//! [train-checked]

torch::Tensor parameters(ANN& model) {  // all of them, in one vector
  return torch::nn::utils::parameters_to_vector(model->parameters()).detach();
}
// Whether `value` (an integer tensor) is rank 0's: each rank compares its own with rank 0's.
bool equals_rank0(course::CommGroup& group, const torch::Tensor& value,
                  std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> rank0{value.clone()};
  wait_within(group, *group.broadcast(rank0), value.device(), timeout);  // rank 0's, to every rank
  return torch::equal(value.cpu(), rank0[0].cpu());
}

// ---- a rank of the job: lesson 09's part 2, with each check above -------------------------------
void rank_job(const course::RankInfo& info, const torch::Device& device,
              const course::ImageSet& train, const course::ImageSet& test, int epochs,
              std::int64_t batch, std::uint64_t seed, std::chrono::milliseconds timeout,
              course::Verdict& verdict) {
  auto group = lesson17::join_job(info, device, timeout);  // lesson 17's start of a rank
  RankRun run;
  bool same_trail = false, same_parameters = false;
  try {
    lesson17::connect_group(*group, info, device, timeout);
    run = train_checked(*group, info.rank, info.world_size, train, epochs, batch, device, seed,
                        timeout);
    same_trail = equals_rank0(*group, run.trail, timeout);
    same_parameters = equals_rank0(*group, parameters(run.model).view(torch::kInt), timeout);
  } catch (const std::exception& e) {  // a peer died (its socket closed) or stopped answering
    course::exit_lost_job(info.rank, e, verdict, "lesson 18 rank " + std::to_string(info.rank));
  }
  course::shutdown_group(*group);  // the last collective is done: end the group in order
  double worst = 0;
  for (const double d : run.gradient_diffs) worst = std::max(worst, d);
  std::printf(
      "summed gradient vs one process's over the global batch, steps 1-%zu: largest "
      "relative difference %.2e (tolerance %.0e)\nparameter checksum %016llx\n",
      run.gradient_diffs.size(), worst, course::tolerance_for(torch::kFloat),
      static_cast<unsigned long long>(course::checksum(parameters(run.model))));
  verdict.check(!run.gradient_diffs.empty() && worst <= course::tolerance_for(torch::kFloat),
                "the ranks' summed gradient is one process's over the global batch");
  verdict.check(same_trail, "this rank held rank 0's parameters at every step");
  verdict.check(same_parameters, "and holds them at the end, bit for bit");
  // Silent failure 3, a job that learns something else: against lesson 09's loop as one process
  // (a group of one) with the global batch, W x B.
  std::vector<double> one_losses;
  auto alone = make_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, device, timeout);
  ANN one = train_data_parallel(*alone, 0, 1, train, epochs, batch * info.world_size, device, seed,
                                timeout, &one_losses);
  course::shutdown_group(*alone);
  const double accuracy = course::test_accuracy(run.model, test, device);
  const double one_accuracy = course::test_accuracy(one, test, device);
  const double apart = course::relative_diff(parameters(run.model), parameters(one));
  std::printf(
      "one process: parameters %.2e apart (relative), final loss %.4f vs %.4f, test "
      "accuracy %.4f vs %.4f\n",
      apart, run.losses.back(), one_losses.back(), accuracy, one_accuracy);
  verdict.check(
      std::abs(run.losses.back() - one_losses.back()) <= kLossMargin * one_losses.back() &&
          std::abs(accuracy - one_accuracy) <= kAccuracyMargin,
      "the ranks learn what one process learns: loss and accuracy");
}

// ---- run plainly: a job of two CPU ranks of this program --------------------------------------
// Starts this program as a job of two ranks on this host's CPU (Gloo), each with one thread, and
// prints what each rank printed; passes when both ranks pass. The ranks get the run's --seed,
// --quick, --data-dir, --epochs (0: their default), --batch-size and --timeout.
void run_a_job(const course::CommonOptions& options, int epochs, std::int64_t batch, int timeout_s,
               course::Verdict& verdict) {
  course::LocalJob job;
  job.argv = {course::self_executable(),
              "--device",
              "cpu",
              "--threads",
              "1",
              "--seed",
              std::to_string(options.seed),
              "--epochs",
              std::to_string(epochs),
              "--batch-size",
              std::to_string(batch),
              "--timeout",
              std::to_string(timeout_s)};
  const bool quick = options.quick;
  if (quick) job.argv.push_back("--quick");
  if (!options.data_dir.empty()) job.argv.insert(job.argv.end(), {"--data-dir", options.data_dir});
  job.port = course::free_tcp_port();
  // A hang's limit: the rendezvous' and the last collective's waits, and an epoch (with its run
  // as one process) within a --timeout each.
  const int most_epochs = epochs > 0 ? epochs : (quick ? 1 : kEpochs);
  job.deadline = std::chrono::seconds(timeout_s) * (2 + most_epochs);
  std::printf("a job of 2 ranks on this host's CPU (Gloo), one thread each%s:\n",
              quick ? ", --quick" : "");
  std::fflush(stdout);
  const course::JobEnding ending = course::run_local_job(job);
  int passed = 0;
  for (std::size_t r = 0; r < ending.outputs.size(); ++r) {
    for (const std::string& line : ending.outputs[r])
      std::printf("  rank %zu> %s\n", r, line.c_str());
    passed += !ending.hung && WIFEXITED(ending.statuses[r]) && WEXITSTATUS(ending.statuses[r]) == 0;
  }
  verdict.check(passed == static_cast<int>(ending.outputs.size()) && passed == 2,
                "both ranks pass every check", std::to_string(passed) + "/2 ranks passed");
}

}  // namespace lesson18

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson18.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson18;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0, batch = kBatchPerRank, timeout_s = kTimeoutSeconds;
  course::Cli cli("lesson18_silent_failures",
                  "Lesson 18: lesson 09's job checked for the failures that raise no error. Under "
                  "torchrun, it is one rank; run plainly, it starts a job of two CPU ranks.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs, as a rank (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch, "samples per rank per step", 1, 60000);
  cli.add_option("--timeout", timeout_s, "seconds to wait for a rank", 1, 86400);
  if (auto code = cli.parse(argc, argv)) return *code;

  const std::optional<course::RankInfo> job = course::rank_from_environment();
  // One rank per device, by lesson 17's rule; the host's cores shared out.
  const std::string reason = job ? lesson17::take_rank_device(options, *job) : "";
  const torch::Device device = course::start_lesson(options);  // prints the device first
  if (!reason.empty()) std::cout << "(" << reason << ")\n";
  course::find_fashion_mnist(options.data_dir);  // every rank reads it: said at once if missing
  course::Verdict verdict;
  if (!job) {  // run plainly: a job of two ranks of this program, on the CPU
    run_a_job(options, epochs, batch, timeout_s, verdict);
    return verdict.finish("lesson 18: a job of 2 CPU ranks");
  }
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? 1 : kEpochs;
  rank_job(*job, device, train, test, epochs, batch, options.seed, std::chrono::seconds(timeout_s),
           verdict);
  return verdict.finish("lesson 18 rank " + std::to_string(job->rank) + " of " +
                        std::to_string(job->world_size) + " on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
