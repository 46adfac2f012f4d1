// Lesson 17 (going further) — distributed failures: lesson 09's job when a rank dies, stops, never
// arrives or cannot reach the others, and the failures that raise no error. The file starts with
// lesson 09's loop as lesson 09 writes it; each section after it adds one thing to it:
//   - every rank of a host takes its device by one rule, then the ranks agree before they form a
//     group: never a job split between NCCL and Gloo, nor two ranks on one GPU;
//   - the rendezvous waits once, at most --timeout, and says how many ranks arrived; an address
//     nobody serves and a port already taken are errors that say so;
//   - NCCL's wait() returns at once, and a dead peer leaves its kernel waiting until NCCL's
//     watchdog aborts the process: here the host waits with a deadline, then aborts the group;
//   - silent failures, checked at each step of lesson 09's loop: the summed gradient against one
//     process's, every rank's parameters against rank 0's; what they learn against one process's;
//   - run plainly, it starts jobs of two ranks (of itself, of lesson 09) and fails one in each way.
// Run:    build/bin/lesson17_distributed_failures [--device ...] [--quick]  (the failures, timed)
//         torchrun --no-python --nproc-per-node 2 build/bin/lesson17_distributed_failures  (a job)
// Checks: run plainly, that this lesson's other rank ends with its own error and exit code within
//         --timeout (never a hang), and that a healthy job ends with lesson 09's parameters; as a
//         rank, each silent failure's check. Exit 0 PASS, 1 FAIL (or a rank lost), 2 bad input.
#include <signal.h>       // defines: SIGKILL, SIGSTOP
#include <torch/torch.h>  // defines: torch::nn, torch::optim

#include <torch/csrc/distributed/c10d/HashStore.hpp>    // defines: c10d::HashStore (a group of one)
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>  // defines: c10d::PrefixStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>     // defines: c10d::TCPStore (the rendezvous)
#ifdef GPU_LESSONS_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // defines: c10d::ProcessGroupGloo
#endif
#ifdef GPU_LESSONS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // defines: c10d::ProcessGroupNCCL
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <thread>

#include "common/ann.h"            // defines: ANN, test_accuracy
#include "common/child_process.h"  // defines: ChildProcess, describe_status, self_executable
#include "common/cli.h"            // defines: Cli, start_lesson, available_cores
#include "common/compare.h"        // defines: relative_diff, tolerance_for, checksum
#include "common/data.h"           // defines: ImageSet, find_fashion_mnist, load_fashion_mnist
#include "common/device.h"         // defines: cuda_device_count
#include "common/timing.h"         // defines: Stopwatch (lesson 09's epoch time)
#include "common/verdict.h"        // defines: Verdict, CourseError, UsageError, report_error
#include "distributed/c10d.h"      // defines: CommGroup, abort_group, shutdown_group
#include "distributed/launch.h"    // defines: RankInfo, device_identity, exit_lost_job
#include "distributed/sampler.h"   // defines: epoch_order, shard_indices (lesson 09's shards)

namespace lesson17 {

// ---- knobs --------------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 14;
constexpr int kEpochs = 5;  // lesson 09's job: its epochs, batch and Adam
constexpr std::int64_t kBatchPerRank = 64;
constexpr double kLearningRate = 1e-3;
constexpr int kTimeoutSeconds = 120;           // a rank dead or missing: give up after this
constexpr std::int64_t kQuickSamples = 10000;  // --quick: one epoch on the first 10,000 images
constexpr int kCheckedSteps = 5;  // the summed gradient against one process's, for these steps
// The ranks against one process with the global batch: by what they learn (parameters drift).
constexpr double kLossMargin = 0.02;      // final epoch's loss, relative
constexpr double kAccuracyMargin = 0.01;  // test accuracy, absolute
constexpr int kFailTimeoutSeconds = 5;    // run plainly: the jobs' --timeout
constexpr int kFailEpochs = 50;           // a rank to be killed or stopped is still training then
constexpr int kSlackSeconds = 15;         // start-up (LibTorch, the data) on a busy machine
// Run plainly with --quick (the smoke test), the jobs' --timeout: short, as several cases wait a
// whole --timeout; yet enough, as a job's ranks wait for each other only as their start-ups differ.
constexpr int kQuickFailTimeoutSeconds = 3;

// ---- lesson 09's job, as lesson 09 writes it ----------------------------------------------------
// The tutorial's ANN (common/ann.h; lesson 09 declares it again, layers in the same order: the same
// seed, the same weights). Lesson 09's shards: course::epoch_order and course::shard_indices.
using course::ANN;
// Lesson 09's work->wait(timeout) returns at once on NCCL: here every collective waits through
// wait_within() instead, with a deadline on NCCL too (in its section, below).
void wait_within(course::CommGroup& group, c10d::Work& work, const torch::Device& device,
                 std::chrono::milliseconds timeout);

//! [lesson09-collectives]
// DistributedDataParallel(model) starts every rank from rank 0's parameters: a broadcast.
void broadcast_parameters(course::CommGroup& group, ANN& model, std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;  // the backend writes into the parameters themselves
  for (auto& p : model->parameters()) {
    std::vector<torch::Tensor> tensors{p};
    wait_within(group, *group.broadcast(tensors), p.device(), timeout);  // from rank 0
  }
}
// Every rank's `tensor` summed, in place, on every rank.
void allreduce_sum(course::CommGroup& group, torch::Tensor& tensor,
                   std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> tensors{tensor};
  wait_within(group, *group.allreduce(tensors), tensor.device(), timeout);  // ReduceOp::SUM
}
// What DDP does after backward(): the gradients into a flat bucket (DDP's have a set size; this
// model's gradients fit one), one all-reduce, and each gradient copied back from the sum.
void allreduce_gradients(course::CommGroup& group, ANN& model, std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> params = model->parameters(), grads;
  for (const auto& p : params)  // a rank with no samples this step adds zeros
    grads.push_back(p.grad().defined() ? p.grad().view(-1) : torch::zeros_like(p).view(-1));
  torch::Tensor bucket = torch::cat(grads);
  allreduce_sum(group, bucket, timeout);
  for (std::int64_t i = 0, offset = 0; i < static_cast<std::int64_t>(params.size()); ++i) {
    params[i].mutable_grad() =
        bucket.slice(0, offset, offset + params[i].numel()).view_as(params[i]).clone();
    offset += params[i].numel();
  }
}
//! [lesson09-collectives]
//! [lesson09-loop]
// Lesson 05's loop as rank `rank` of `world_size` (a group of one: one process). Added: `losses`,
// and `check`, given the step's samples (all ranks') once the gradients are summed, before Adam.
using StepCheck = std::function<void(ANN& model, const torch::Tensor& global)>;
ANN train_data_parallel(course::CommGroup& group, int rank, int world_size,
                        const course::ImageSet& train, int epochs, std::int64_t batch_per_rank,
                        const torch::Device& device, std::uint64_t seed,
                        std::chrono::milliseconds timeout, std::vector<double>* losses = nullptr,
                        const StepCheck& check = nullptr) {
  torch::manual_seed(seed);  // the same weights on every rank (the broadcast makes sure)
  ANN model;
  model->to(device);                            // model = SimpleNN().to(device), lesson 05's ANN
  broadcast_parameters(group, model, timeout);  // model = DistributedDataParallel(model)
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  const std::int64_t samples = train.images.size(0), global_batch = world_size * batch_per_rank;
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    course::Stopwatch watch(device);
    const torch::Tensor order = course::epoch_order(samples, seed, epoch);  // DistributedSampler
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (std::int64_t step = 0; step * global_batch < samples; ++step) {
      const auto idx = course::shard_indices(order, step, rank, world_size, batch_per_rank);
      const double in_step = std::min<double>(global_batch, samples - step * global_batch);
      optimizer.zero_grad();
      if (idx.numel() > 0) {
        torch::Tensor features = train.images.index_select(0, idx).to(device);
        torch::Tensor labels = train.labels.index_select(0, idx).to(device);
        // This rank's share of the global batch's mean loss: the ranks' gradients sum to the
        // gradient of that mean (DDP divides the sum by the world size: the same for full batches).
        torch::Tensor loss =
            torch::nn::functional::cross_entropy(model->forward(features), labels, sum) / in_step;
        loss.backward();
        loss_sum += loss.detach() * in_step;
      }
      allreduce_gradients(group, model, timeout);  // waits for every rank
      if (check) check(model, order.slice(0, step * global_batch, (step + 1) * global_batch));
      optimizer.step();  // the same gradients and the same state: the same step on every rank
    }
    allreduce_sum(group, loss_sum, timeout);  // every rank's samples
    const double seconds = watch.seconds(), loss = loss_sum.item<double>() / samples;
    std::printf("  rank %d/%d epoch %d/%d  loss %.4f  %6.3f s  %9.0f samples/s (all ranks)\n", rank,
                world_size, epoch + 1, epochs, loss, seconds, samples / seconds);
    std::fflush(stdout);
    if (losses) losses->push_back(loss);
  }
  return model;
}
//! [lesson09-loop]

// ---- which device each rank takes, and the ranks' agreement -------------------------------------
struct RankDevice {
  std::string device;  // "cpu", "cuda:N", or the request as given when no GPU is visible
  std::string reason;  // why the ranks train on the CPU although GPUs are visible; else empty
};
//! [rank-device]
// One rule, which every rank of a host applies to the same facts (the GPUs it sees, the ranks on
// the host, CUDA_VISIBLE_DEVICES), so that all ranks land on the same kind of device.
RankDevice rank_device(const std::string& requested, int gpus, const course::RankInfo& info,
                       const std::string& cuda_visible_devices) {
  if (requested != "auto" && requested != "cuda") return {requested, ""};  // cpu, cuda:N
  if (gpus == 0) return {requested, ""};  // start_lesson falls back to the CPU and says why
  if (gpus >= info.local_world_size) return {"cuda:" + std::to_string(info.local_rank), ""};
  if (gpus == 1 && !cuda_visible_devices.empty() &&
      cuda_visible_devices.find(',') == std::string::npos) {
    return {"cuda:0", ""};  // the launcher gave this rank a GPU of its own
  }
  // Fewer GPUs than ranks: some ranks would take a GPU and NCCL, the others the CPU and Gloo,
  // and a group cannot be both. Every rank of the host sees the same counts, so all decide alike.
  const std::string counts = std::to_string(gpus) + " GPU(s) visible to " +
                             std::to_string(info.local_world_size) + " ranks on this host";
  if (requested == "cuda") {
    throw course::UsageError("--device cuda: " + counts + ", and NCCL needs a GPU for every rank",
                             "start at most " + std::to_string(gpus) +
                                 " rank(s) per host (torchrun --nproc-per-node), give each rank "
                                 "its own GPU with CUDA_VISIBLE_DEVICES, or use --device cpu");
  }
  return {"cpu", counts + ": every rank trains on the CPU (Gloo)"};
}
//! [rank-device]

// Why ranks on these devices (identities in rank order) cannot form one group: a mix of CPU and
// GPU ranks, or two ranks on one GPU. Empty when they can.
std::string devices_conflict(const std::vector<std::string>& identities) {
  const auto on_gpu = [](const std::string& id) { return id.rfind("cuda", 0) == 0; };
  const auto gpu_of = [](const std::string& id) { return id.substr(id.find(' ') + 1); };
  for (size_t r = 1; r < identities.size(); ++r) {
    if (on_gpu(identities[r]) != on_gpu(identities[0])) {
      return "rank 0 trains on " + identities[0] + " and rank " + std::to_string(r) + " on " +
             identities[r] + ": one group has one backend (NCCL for GPUs, Gloo for the CPU)";
    }
  }
  for (size_t a = 0; a < identities.size() && on_gpu(identities[0]); ++a) {
    for (size_t b = a + 1; b < identities.size(); ++b) {
      if (gpu_of(identities[a]) == gpu_of(identities[b])) {
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share one GPU (" +
               gpu_of(identities[a]) + "): NCCL needs a GPU of its own for every rank";
      }
    }
  }
  return "";
}

// ---- the rendezvous, with its deadline ----------------------------------------------------------
//! [connect-store]
// Lesson 09's store, whose failures are told apart: a port already taken on rank 0, or an address
// nobody serves (a client waits at most `timeout` for rank 0's store to exist).
c10::intrusive_ptr<c10d::Store> connect_store(const course::RankInfo& info,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(info.master_port);
  options.isServer = !info.agent_store && info.rank == 0;
  options.numWorkers = info.world_size;
  options.waitWorkers = false;  // meet_the_others() waits for the ranks, once
  options.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
    // Keys of this attempt only: a job torchrun restarts does not read the last one's leftovers.
    return c10::make_intrusive<c10d::PrefixStore>("attempt_" + std::to_string(info.restart_count),
                                                  store);
  } catch (const std::exception& e) {
    const std::string message = course::error_message(e), port = std::to_string(info.master_port);
    if (message.find("in use") != std::string::npos || message.find("EADDRINUSE") != message.npos) {
      throw course::CourseError("rank 0 cannot host the rendezvous: port " + port + " is in use",
                                "pick a free port: torchrun --master-port P, or MASTER_PORT=P");
    }
    throw course::CourseError("rank " + std::to_string(info.rank) +
                                  " cannot reach the rendezvous at " + info.master_addr + ":" +
                                  port + ": " + message,
                              "check MASTER_ADDR/MASTER_PORT (torchrun --rdzv-endpoint), that "
                              "rank 0 runs, and that no firewall blocks the port");
  }
}
//! [connect-store]

//! [meet-the-others]
// The rendezvous' one wait: every rank puts its device in the store, then waits at most `timeout`
// for every other rank's. The same error on every rank when one never arrives, or when the
// devices cannot form one group, before any group is formed.
void meet_the_others(c10d::Store& store, const course::RankInfo& info, const torch::Device& device,
                     std::chrono::milliseconds timeout) {
  const std::string mine = course::device_identity(device);  // "cpu", or "cuda:N GPU-<uuid>"
  store.set("device/" + std::to_string(info.rank),
            std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < info.world_size; ++r) keys.push_back("device/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    int arrived = 0;
    for (const auto& key : keys) arrived += store.check({key}) ? 1 : 0;
    throw course::CourseError("rank " + std::to_string(info.rank) + " gave up waiting for the " +
                                  "other ranks: " + std::to_string(arrived) + " of " +
                                  std::to_string(info.world_size) + " arrived within " +
                                  std::to_string(timeout.count() / 1000) + " s",
                              "start every rank (torchrun --nproc-per-node, --nnodes) within "
                              "--timeout, with the same MASTER_ADDR and MASTER_PORT");
  }
  std::vector<std::string> identities;
  for (const auto& key : keys) {
    const std::vector<std::uint8_t> value = store.get(key);
    identities.emplace_back(value.begin(), value.end());
  }
  const std::string conflict = devices_conflict(identities);
  if (!conflict.empty()) {
    throw course::CourseError("these ranks cannot form one group: " + conflict,
                              "give every rank a GPU of its own (torchrun --nproc-per-node at "
                              "most the GPU count, or CUDA_VISIBLE_DEVICES per rank), or run "
                              "every rank with --device cpu");
  }
}
//! [meet-the-others]

// ---- collectives with a deadline, on NCCL too ---------------------------------------------------
// NCCL has run on one GPU (an H200); a rank killed in an NCCL job needs two and has not run.
// Lesson 09's group, with NCCL's watchdog set to twice `timeout`: a last resort behind
// wait_within(), which gives up first and says so.
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout) {
#ifdef GPU_LESSONS_WITH_NCCL
  if (device.is_cuda()) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = 2 * timeout;  // NCCL's watchdog aborts the process: wait_within first
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  }
#endif
#ifdef GPU_LESSONS_WITH_GLOO
  if (device.is_cpu()) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
  }
#endif
  throw course::CourseError("this build has no c10d backend for " + device.str(),
                            "Gloo needs libgloo-dev at build time, NCCL a CUDA LibTorch");
}

//! [wait-within]
// Waits until `work`, a collective on `device`'s tensors, is done: at most `timeout`, then the
// group is aborted and std::runtime_error says so. A collective that failed (a peer's connection
// closed) throws its own error.
void wait_within(course::CommGroup& group, c10d::Work& work, const torch::Device& device,
                 std::chrono::milliseconds timeout) {
  if (!device.is_cuda()) {
    work.wait(timeout);  // Gloo: blocks; throws when a peer is gone or the time is up
    return;
  }
  // NCCL: wait() only makes the current CUDA stream wait for the collective, and returns at
  // once. A dead peer would leave the collective's kernel waiting on the GPU, and this process
  // stuck at its next sync. So the host watches the collective, and the clock.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!work.isCompleted()) {
    if (std::chrono::steady_clock::now() > deadline) {
      course::abort_group(group);  // the kernels stop waiting for the peer
      throw std::runtime_error("a collective did not finish within " +
                               std::to_string(timeout.count() / 1000) + " s: a rank stopped");
    }
    std::this_thread::yield();
  }
  work.wait();  // a collective that failed throws its error here
}
//! [wait-within]

// ---- silent failures: lesson 09's loop, checked at each step ------------------------------------
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
  std::printf("rank %d of %d (local rank %d): rendezvous at %s:%d, timeout %lld s\n", info.rank,
              info.world_size, info.local_rank, info.master_addr.c_str(), info.master_port,
              static_cast<long long>(timeout.count() / 1000));
  auto store = connect_store(info, timeout);
  meet_the_others(*store, info, device, timeout);  // everyone is here, one backend for all
  auto group = make_group(store, info.rank, info.world_size, device, timeout);
  RankRun run;
  bool same_trail = false, same_parameters = false;
  try {
    // NCCL connects at its first collective: only an answer from every rank says the group works.
    torch::Tensor answered = torch::ones({1}, torch::TensorOptions().device(device));
    allreduce_sum(*group, answered, timeout);
    std::printf("%s group of %d connected (%d rank(s) answered a first all-reduce)\n",
                device.is_cuda() ? "nccl" : "gloo", info.world_size, answered.item<int>());
    run = train_checked(*group, info.rank, info.world_size, train, epochs, batch, device, seed,
                        timeout);
    same_trail = equals_rank0(*group, run.trail, timeout);
    same_parameters = equals_rank0(*group, parameters(run.model).view(torch::kInt), timeout);
  } catch (const std::exception& e) {  // a peer died (its socket closed) or stopped answering
    course::exit_lost_job(info.rank, e, verdict, "lesson 17 rank " + std::to_string(info.rank));
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

// ---- run plainly: jobs of two ranks, one of them failed -----------------------------------------
//! [failures]
// One way to fail a job of two ranks, and how this lesson's other rank must end: counted from the
// signal (or start), after 0.5 x waits x --timeout; a failure by max(1, waits) x --timeout + slack.
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
  if (*failure.env != '\0') job.environment.emplace_back(failure.env);
  job.signal = failure.signal;
  job.after = "epoch 1/";
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

// Each failure in a job of lesson 09 (if beside this program) and of this lesson; a thread a rank.
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
    std::string said[2];  // what lesson 09's and this lesson's first rank said
    for (const bool as09 : {true, false}) {
      if (as09 && !have09) continue;
      const auto [e, line] = run_job(as09 ? lesson09 : here, f, flags, timeout_s);
      std::printf("   lesson %s: %s%s after %.1f s: %s\n", as09 ? "09" : "17",
                  e.hung ? "HUNG, " : "", course::describe_status(e.statuses.front()).c_str(),
                  e.seconds,
                  line.size() > 100 ? (line.substr(0, 97) + "...").c_str() : line.c_str());
      std::fflush(stdout);
      said[as09] = line.substr(0, 35);  // enough for "parameter checksum " and its 16 digits
      if (as09) continue;
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
      verdict.check(said[0] == said[1], "the same parameters as lesson 09's");
  }
}

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
  RankDevice choice{options.device, ""};
  if (job) {  // one rank per device, by one rule on every rank; the host's cores shared out
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    choice = rank_device(options.device, course::cuda_device_count(), *job, visible ? visible : "");
    options.device = choice.device;
    if (options.threads == 0)
      options.threads = std::max(1, course::available_cores() / job->local_world_size);
  }
  const torch::Device device = course::start_lesson(options);  // prints the device first
  if (!choice.reason.empty()) std::cout << "(" << choice.reason << ")\n";
  const auto folder = course::find_fashion_mnist(options.data_dir);  // every rank reads it
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
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  const course::ImageSet test = course::load_fashion_mnist(folder, /*train=*/false);
  if (options.quick) train = course::take(train, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? 1 : kEpochs;
  rank_job(*job, device, train, test, epochs, batch, options.seed, std::chrono::seconds(timeout_s),
           verdict);
  return verdict.finish("lesson 17 rank " + std::to_string(job->rank) + " of " +
                        std::to_string(job->world_size) + " on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
