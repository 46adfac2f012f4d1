// Lesson 14 (going further) — distributed failures: lesson 09's job when a rank dies, stops, never
// arrives or cannot reach the others, and the failures that raise no error. Measured against
// lesson 09:
//   - a rank's device by one rule that every rank of a host applies alike (fewer GPUs than ranks:
//     all on the CPU, or an error), then the ranks agree before they form a group: never a job
//     split between NCCL and Gloo, nor two ranks on one GPU;
//   - the rendezvous waits once, at most --timeout, and says how many ranks arrived; an address
//     nobody serves and a port already taken are errors that say so;
//   - NCCL: wait() returns at once, and a dead peer leaves the collective's kernel waiting until
//     NCCL's watchdog aborts the process (SIGABRT, none of the lesson's words). Here the host
//     waits for every collective with a deadline, aborts the group, and ends with its own error;
//   - silent failures: the ranks' summed gradient checked against one process's for the first
//     steps (a rank's missing gradient shows), and every rank's parameters compared with rank 0's
//     after every step (a rank that drifts shows);
//   - run plainly, it starts jobs of two ranks, of itself and of lesson 09, fails one rank in each
//     way, and measures how the other rank ends.
//
// Run:    build/bin/lesson14_distributed_failures [--device ...] [--quick]  (the failures, timed)
//         torchrun --no-python --nproc-per-node 2 build/bin/lesson14_distributed_failures  (a job)
// Checks: run plainly, that in each failure this lesson's other rank ends with its own error and
//         exit code within --timeout (never a hang), and that its healthy job ends with lesson
//         09's parameters, bit for bit. As a rank: every rank holds rank 0's parameters after
//         every step, and the summed gradient is one process's (tolerance by dtype). Exit 0 PASS,
//         1 FAIL (a check, or a rank lost), 2 bad flag, data, device or rendezvous.
#include <signal.h>  // defines: SIGKILL, SIGSTOP
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>  // defines: c10d::PrefixStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>     // defines: c10d::TCPStore (the rendezvous)
#include <torch/torch.h>  // defines: torch::nn, torch::optim
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
#include <iostream>
#include <memory>
#include <thread>

#include "common/c10d.h"           // defines: CommGroup, abort_group, shutdown_group
#include "common/child_process.h"  // defines: ChildProcess, describe_status, self_executable
#include "common/cli.h"            // defines: Cli, start_lesson, available_cores
#include "common/compare.h"        // defines: relative_diff, tolerance_for, checksum
#include "common/data.h"           // defines: ImageSet, find_fashion_mnist, load_fashion_mnist
#include "common/device.h"         // defines: cuda_device_count, list_gpus
#include "common/launch.h"         // defines: RankInfo, rank_from_environment, rank_environment
#include "common/verdict.h"        // defines: Verdict, CourseError, UsageError, report_error

namespace lesson14 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 14;
constexpr int kEpochs = 5;                  // lesson 09's job: its epochs, batch and Adam
constexpr std::int64_t kBatchPerRank = 64;
constexpr double kLearningRate = 1e-3;
constexpr int kTimeoutSeconds = 120;           // a rank dead or missing: give up after this
constexpr std::int64_t kQuickSamples = 10000;  // --quick: one epoch on the first 10,000 images
constexpr int kCheckedSteps = 5;  // the summed gradient against one process's, for these steps
constexpr int kFailTimeoutSeconds = 5;  // run plainly: the jobs' --timeout (3 with --quick)
constexpr int kFailEpochs = 50;         // a rank to be killed or stopped is still training then
constexpr int kSlackSeconds = 15;       // start-up (LibTorch, the data) on a busy machine

// ---- lesson 09's job --------------------------------------------------------------------------
// Lesson 09's ANN (its layers made in the same order, so the same seed gives the same weights).
struct ANNImpl : torch::nn::Module {
  ANNImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        out(register_module("out", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    return out(torch::relu(fc2(torch::relu(fc1(x.view({x.size(0), -1}))))));
  }
  torch::nn::Linear fc1, fc2, out;
};
TORCH_MODULE(ANN);

// Lesson 09's shards: every rank draws the epoch's order from the seed and the epoch; global step
// s takes order[s*W*B, (s+1)*W*B), rank r the r-th B of those.
torch::Tensor epoch_order(std::int64_t samples, std::uint64_t seed, int epoch) {
  auto generator = at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
  return torch::randperm(samples, generator, torch::kLong);
}
torch::Tensor shard_indices(const torch::Tensor& order, std::int64_t step, int rank,
                            int world_size, std::int64_t batch_per_rank) {
  const std::int64_t start = (step * world_size + rank) * batch_per_rank, n = order.size(0);
  return order.slice(0, std::min(start, n), std::min(start + batch_per_rank, n));
}

// ---- which device each rank takes --------------------------------------------------------------
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

// What names a rank's device across processes: "cpu", or "cuda:N GPU-<uuid>".
std::string device_identity(const torch::Device& device) {
  if (!device.is_cuda()) return "cpu";
  for (const auto& gpu : course::list_gpus()) {
    if (gpu.index == device.index()) return device.str() + " " + gpu.uuid;
  }
  return device.str();
}

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

// ---- the rendezvous --------------------------------------------------------------------------
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
    return c10::make_intrusive<c10d::PrefixStore>("attempt_" + std::to_string(info.restart_count), store);
  } catch (const std::exception& e) {
    const std::string message = course::error_message(e);
    if (message.find("in use") != std::string::npos || message.find("EADDRINUSE") != std::string::npos) {
      throw course::CourseError("rank 0 cannot host the rendezvous: port " +
                                    std::to_string(info.master_port) + " is in use (" + message + ")",
                                "pick a free port: torchrun --master-port P, or MASTER_PORT=P");
    }
    throw course::CourseError("rank " + std::to_string(info.rank) + " cannot reach the rendezvous at " +
                                  info.master_addr + ":" + std::to_string(info.master_port) + ": " + message,
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
  const std::string mine = device_identity(device);
  store.set("device/" + std::to_string(info.rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < info.world_size; ++r) keys.push_back("device/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    int arrived = 0;
    for (const auto& key : keys) arrived += store.check({key}) ? 1 : 0;
    throw course::CourseError(
        "rank " + std::to_string(info.rank) + " gave up waiting for the other ranks at " +
            info.master_addr + ":" + std::to_string(info.master_port) + ": " +
            std::to_string(arrived) + " of " + std::to_string(info.world_size) + " arrived within " +
            std::to_string(timeout.count() / 1000) + " s",
        "start all " + std::to_string(info.world_size) + " ranks (torchrun --nproc-per-node, "
        "--nnodes) within --timeout, with the same MASTER_ADDR and MASTER_PORT");
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

std::string backend_for([[maybe_unused]] const torch::Device& device) {
#ifdef GPU_LESSONS_WITH_NCCL
  if (device.is_cuda()) return "nccl";
#endif
#ifdef GPU_LESSONS_WITH_GLOO
  if (device.is_cpu()) return "gloo";
#endif
  return "";
}

// Lesson 09's group, with NCCL's watchdog set to twice `timeout`: a last resort behind
// wait_within(), which gives up first and says so.
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout) {
  try {
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
  } catch (const std::exception& e) {
    throw course::CourseError("rank " + std::to_string(rank) + " could not form the " +
                                  backend_for(device) + " group of " + std::to_string(world_size) +
                                  ": " + course::error_message(e),
                              "a rank died at start-up: read the other ranks' output");
  }
  throw course::CourseError("this build has no c10d backend for " + device.str(),
                            "Gloo needs libgloo-dev at build time, NCCL a CUDA LibTorch");
}

// ---- collectives with a deadline -------------------------------------------------------------
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
                               std::to_string(timeout.count() / 1000) +
                               " s: another rank stopped taking part");
    }
    std::this_thread::yield();
  }
  work.wait();  // a collective that failed throws its error here
}
//! [wait-within]

// Every rank's `tensor` summed, in place, on every rank; or rank 0's, with `from_rank0`.
void collective(course::CommGroup& group, torch::Tensor& tensor, std::chrono::milliseconds timeout,
                bool from_rank0 = false) {
  std::vector<torch::Tensor> tensors{tensor};
  wait_within(group, from_rank0 ? *group.broadcast(tensors) : *group.allreduce(tensors),
              tensor.device(), timeout);
}

// How many ranks answer an all-reduce: the group's first collective, which connects NCCL.
int ranks_answering(course::CommGroup& group, const torch::Device& device,
                    std::chrono::milliseconds timeout) {
  torch::Tensor one = torch::ones({1}, torch::TensorOptions().device(device));
  collective(group, one, timeout);
  return static_cast<int>(one.item<float>());
}

// Whether `value` (an integer tensor) is rank 0's: each rank compares its own with rank 0's.
bool equals_rank0(course::CommGroup& group, const torch::Tensor& value,
                  std::chrono::milliseconds timeout) {
  torch::Tensor rank0 = value.clone();
  collective(group, rank0, timeout, /*from_rank0=*/true);
  return torch::equal(value.cpu(), rank0.cpu());
}

// ---- the job, and the checks that catch a silent failure ---------------------------------------
// One process's gradient over `indices` (a global step's samples, every rank's) from the model's
// parameters, as the ranks' losses add up to it; the model's own gradients are left as they were.
torch::Tensor gradient_of_global_batch(ANN& model, const course::ImageSet& train,
                                       const torch::Tensor& indices, const torch::Device& device) {
  std::vector<torch::Tensor> params = model->parameters(), kept, grads;
  for (auto& p : params) kept.push_back(std::exchange(p.mutable_grad(), torch::Tensor()));
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  const torch::Tensor x = train.images.index_select(0, indices).to(device);
  const torch::Tensor y = train.labels.index_select(0, indices).to(device);
  (torch::nn::functional::cross_entropy(model->forward(x), y, sum) / static_cast<double>(x.size(0)))
      .backward();
  for (size_t i = 0; i < params.size(); ++i) {
    grads.push_back(params[i].grad().view(-1));
    params[i].mutable_grad() = kept[i];
  }
  return torch::cat(grads);
}

struct RankRun {
  ANN model{nullptr};
  std::vector<double> gradient_diffs;  // the first kCheckedSteps steps: summed vs one process's
  torch::Tensor trail;  // the parameters' bits after every step, added up (int64): equal ranks,
                        // equal trails
};

//! [train-checked]
// Lesson 09's loop as rank `rank` of `world_size`, every collective within `timeout`, with the
// checks of a silent failure: the summed gradient against one process's, the parameters' trail.
RankRun train_checked(course::CommGroup& group, int rank, int world_size,
                      const course::ImageSet& train, int epochs, std::int64_t batch_per_rank,
                      const torch::Device& device, std::uint64_t seed,
                      std::chrono::milliseconds timeout) {
  torch::manual_seed(seed);
  RankRun run{ANN(), {}, torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device))};
  ANN& model = run.model;
  model->to(device);
  {
    torch::NoGradGuard no_grad;  // rank 0's parameters to every rank
    for (auto& p : model->parameters()) collective(group, p, timeout, /*from_rank0=*/true);
  }
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  const std::int64_t samples = train.images.size(0), global_batch = world_size * batch_per_rank;
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const torch::Tensor order = epoch_order(samples, seed, epoch);
    for (std::int64_t step = 0; step * global_batch < samples; ++step) {
      const torch::Tensor idx = shard_indices(order, step, rank, world_size, batch_per_rank);
      const std::int64_t in_step = std::min(global_batch, samples - step * global_batch);
      optimizer.zero_grad();
      if (idx.numel() > 0) {
        (torch::nn::functional::cross_entropy(model->forward(train.images.index_select(0, idx).to(device)),
                                              train.labels.index_select(0, idx).to(device), sum) /
         static_cast<double>(in_step)).backward();
      }
      std::vector<torch::Tensor> params = model->parameters(), grads;
      for (const auto& p : params) {
        grads.push_back(p.grad().defined() ? p.grad().view(-1) : torch::zeros_like(p).view(-1));
      }
      torch::Tensor bucket = torch::cat(grads);
      collective(group, bucket, timeout);  // lesson 09's all-reduce, within the deadline
      for (std::int64_t i = 0, offset = 0; i < static_cast<std::int64_t>(params.size()); ++i) {
        params[i].mutable_grad() = bucket.slice(0, offset, offset + params[i].numel()).view_as(params[i]).clone();
        offset += params[i].numel();
      }
      if (epoch == 0 && step < kCheckedSteps) {  // silent failure 1: a gradient missing or scaled
        const torch::Tensor global = order.slice(0, step * global_batch, step * global_batch + in_step);
        run.gradient_diffs.push_back(
            course::relative_diff(bucket, gradient_of_global_batch(model, train, global, device)));
      }
      optimizer.step();
      // Silent failure 2: parameters that drift apart. Their bits added up, on the device (no sync).
      for (const auto& p : params) run.trail += p.detach().view(torch::kInt).sum(torch::kLong);
    }
    std::printf("  rank %d/%d epoch %d/%d done\n", rank, world_size, epoch + 1, epochs);
    std::fflush(stdout);
  }
  return run;
}
//! [train-checked]

// ---- as a rank -----------------------------------------------------------------------------------
void rank_job(const course::RankInfo& info, const torch::Device& device,
              const course::ImageSet& train, int epochs, std::int64_t batch, std::uint64_t seed,
              std::chrono::milliseconds timeout, course::Verdict& verdict) {
  std::printf("rank %d of %d (local rank %d): rendezvous at %s:%d (%s), timeout %lld s\n",
              info.rank, info.world_size, info.local_rank, info.master_addr.c_str(),
              info.master_port, info.agent_store ? "the launcher's store"
              : info.rank == 0 ? "hosted by this rank" : "hosted by rank 0",
              static_cast<long long>(timeout.count() / 1000));
  std::fflush(stdout);
  auto store = connect_store(info, timeout);
  meet_the_others(*store, info, device, timeout);  // everyone is here, one backend for all
  auto group = make_group(store, info.rank, info.world_size, device, timeout);
  RankRun run;
  bool same_trail = false, same_parameters = false;
  try {
    // NCCL connects at its first collective: only an answer from every rank says the group works.
    const int answered = ranks_answering(*group, device, timeout);
    std::printf("%s group of %d connected (%d rank(s) answered a first all-reduce)\n",
                backend_for(device).c_str(), info.world_size, answered);
    std::fflush(stdout);
    run = train_checked(*group, info.rank, info.world_size, train, epochs, batch, device, seed, timeout);
    same_trail = equals_rank0(*group, run.trail, timeout);
    same_parameters = equals_rank0(
        *group, torch::nn::utils::parameters_to_vector(run.model->parameters()).detach().view(torch::kInt),
        timeout);
  } catch (const std::exception& e) {  // a peer died (its socket closed) or stopped answering
    course::print_error("rank " + std::to_string(info.rank) + " lost the job during training: " +
                            course::error_message(e), "another rank died or stopped: its own output says why");
    verdict.check(false, "every rank finished training");
    const int code = verdict.finish("lesson 14 rank " + std::to_string(info.rank));
    std::fflush(stdout);
    std::_Exit(code);  // a group whose peer is gone may block in its destructor: nothing to save
  }
  course::shutdown_group(*group);  // the last collective is done: end the group in order
  double worst = 0;
  for (const double d : run.gradient_diffs) worst = std::max(worst, d);
  std::printf("summed gradient vs one process's over the global batch, steps 1-%zu: largest "
              "relative difference %.2e (tolerance %.0e)\n", run.gradient_diffs.size(), worst,
              course::tolerance_for(torch::kFloat));
  std::printf("parameter checksum %016llx\n", static_cast<unsigned long long>(course::checksum(
      torch::nn::utils::parameters_to_vector(run.model->parameters()).detach())));
  verdict.check(!run.gradient_diffs.empty() && worst <= course::tolerance_for(torch::kFloat),
                "the ranks' summed gradient is one process's over the global batch");
  verdict.check(same_trail, "this rank held rank 0's parameters after every step");
  verdict.check(same_parameters, "and holds them at the end, bit for bit");
}

// ---- run plainly: jobs of two ranks, one of them failed ------------------------------------------
struct Failure {
  const char* what;
  std::vector<int> ranks;  // which of the job's two ranks start
  int signal;              // sent to rank 1 once it has trained an epoch (0: none)
  int code;                // the other rank of this lesson exits with this code,
  const char* says;        // saying this,
  double waits;            // after waiting this many --timeout (timed from the signal, if any)
  int gpus;                // GPUs it needs (the job runs on them)
  const char* env;         // added to the ranks' environment
};
const std::vector<Failure> kFailures{
    {"rank 1 killed (SIGKILL) after an epoch", {0, 1}, SIGKILL, 1, "lost the job", 0, 0, ""},
    {"rank 1 stopped (SIGSTOP) after an epoch", {0, 1}, SIGSTOP, 1, "lost the job", 1, 0, ""},
    {"rank 1 never starts", {0}, 0, 2, "1 of 2 arrived", 1, 0, ""},
    {"rank 0 never starts: no store", {1}, 0, 2, "cannot reach the rendezvous", 1, 0, ""},
    {"the rendezvous' port is taken", {0}, 0, 2, "is in use", 0, 0, ""},
    {"NCCL: rank 1 killed after an epoch", {0, 1}, SIGKILL, 1, "lost the job", 0, 2, ""},
    {"NCCL: both ranks given GPU 0", {0, 1}, 0, 2, "share one GPU", 0, 1, "CUDA_VISIBLE_DEVICES=0"}};

struct Ending {
  std::vector<int> statuses;  // the ranks that were not failed, as waitpid() reports them
  double seconds = 0;         // from the failure (the start, or the signal) to their end
  std::string said;           // the first rank's error line, or its checksum line
  bool hung = false;          // still running past the deadline (then killed)
};

// Runs `program` as the job's `ranks` with `flags`, does `failure.signal` to rank 1 once it has
// finished an epoch, and waits for the other ranks to end, at most `deadline`.
Ending run_job(const std::string& program, const Failure& failure, std::vector<std::string> flags,
               std::chrono::seconds deadline) {
  const int port = course::free_tcp_port();
  std::unique_ptr<c10d::TCPStore> taken;  // a store on the port first: it is not free any more
  if (std::string(failure.says) == "is in use") {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;
    taken = std::make_unique<c10d::TCPStore>("127.0.0.1", options);
  }
  std::vector<std::unique_ptr<course::ChildProcess>> ranks(2);
  flags.insert(flags.begin(), program);
  for (const int r : failure.ranks) {
    std::vector<std::string> env = course::rank_environment(r, 2, port);
    if (*failure.env != '\0') env.emplace_back(failure.env);
    ranks[r] = std::make_unique<course::ChildProcess>(flags, env, /*with_stderr=*/true);
  }
  auto start = std::chrono::steady_clock::now();
  if (failure.signal != 0) {
    std::string line;
    while (ranks[1]->read_line(line) && line.find("epoch 1/") == std::string::npos) {}
    ranks[1]->signal(failure.signal);
    start = std::chrono::steady_clock::now();
  }
  Ending ending;
  for (const int r : failure.ranks) {
    if (r == 1 && failure.signal != 0) continue;
    auto status = ranks[r]->wait_for(deadline - std::chrono::duration_cast<std::chrono::seconds>(
                                                    std::chrono::steady_clock::now() - start));
    ending.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ending.hung = ending.hung || !status;
    ending.statuses.push_back(status ? *status : ranks[r]->kill());
    for (const std::string& line : ranks[r]->read_rest()) {
      if (ending.said.empty() && (line.rfind("error:", 0) == 0 || line.rfind("parameter checksum", 0) == 0)) {
        ending.said = line;
      }
    }
  }
  return ending;  // a rank still running (stopped) is killed with its ChildProcess
}

std::string describe(const Ending& e) {
  std::string statuses;
  for (const int s : e.statuses) statuses += (statuses.empty() ? "" : ", ") + course::describe_status(s);
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, " after %.1f s", e.seconds);
  const std::string said = e.said.size() > 110 ? e.said.substr(0, 107) + "..." : e.said;
  return (e.hung ? "HUNG, then " : "") + statuses + seconds + (said.empty() ? "" : ": " + said);
}

// Each failure, in a job of lesson 09 (when it is built beside this program) and of this lesson.
void fail_ranks(const std::string& device, const std::string& data_dir, int timeout_s,
                std::uint64_t seed, course::Verdict& verdict) {
  const std::string here = course::self_executable();
  const std::string lesson09 =
      (std::filesystem::path(here).parent_path() / "lesson09_data_parallel").string();
  const bool have09 = std::filesystem::exists(lesson09);
  std::vector<std::string> flags{"--device", device, "--timeout", std::to_string(timeout_s),
                                 "--seed", std::to_string(seed), "--quick"};
  if (!data_dir.empty()) flags.insert(flags.end(), {"--data-dir", data_dir});
  const auto deadline = std::chrono::seconds(2 * timeout_s + kSlackSeconds);
  std::printf("Jobs of 2 ranks on this host, --device %s --timeout %d%s\n", device.c_str(),
              timeout_s, have09 ? "" : " (lesson 09 is not built beside this program: left out)");

  std::cout << "\n-- a healthy job, one epoch\n";
  const Failure healthy{"", {0, 1}, 0, 0, "parameter checksum", 0, 0, ""};
  std::string sums[2];
  for (const bool as09 : {true, false}) {
    if (as09 && !have09) continue;
    const Ending e = run_job(as09 ? lesson09 : here, healthy, flags, deadline);
    std::printf("   lesson %s: %s\n", as09 ? "09" : "14", describe(e).c_str());
    sums[as09] = e.said.substr(0, 35);  // "parameter checksum " and 16 hex digits
    if (!as09) verdict.check(!e.hung && std::all_of(e.statuses.begin(), e.statuses.end(), [](int s) { return s == 0; }),
                             "a healthy job: both ranks pass");
  }
  if (have09) verdict.check(!sums[0].empty() && sums[0] == sums[1], "and end with lesson 09's parameters, bit for bit");

  const int gpus = course::cuda_device_count();
  for (const Failure& f : kFailures) {
    std::printf("\n-- %s\n", f.what);
    if (f.gpus > 0 && (device == "cpu" || gpus < f.gpus)) {
      std::printf("   (skipped: needs %d GPU(s), --device cuda)\n", f.gpus);
      continue;
    }
    std::vector<std::string> job_flags = flags;
    if (f.signal != 0) job_flags.insert(job_flags.end(), {"--epochs", std::to_string(kFailEpochs)});
    for (const bool as09 : {true, false}) {
      if (as09 && !have09) continue;
      const Ending e = run_job(as09 ? lesson09 : here, f, job_flags, deadline);
      std::printf("   lesson %s: %s\n", as09 ? "09" : "14", describe(e).c_str());
      std::fflush(stdout);
      if (as09) continue;
      const bool ends = !e.hung && std::all_of(e.statuses.begin(), e.statuses.end(), [&](int s) {
        return WIFEXITED(s) && WEXITSTATUS(s) == f.code;
      });
      const double waited = e.seconds / timeout_s;  // no sooner than its wait, never much later
      verdict.check(ends && e.said.find(f.says) != std::string::npos && waited >= 0.9 * f.waits &&
                        e.seconds <= std::max(1.0, f.waits) * timeout_s + kSlackSeconds,
                    std::string(f.what) + ": exit " + std::to_string(f.code) + ", \"" + f.says + "\"");
    }
  }
}

}  // namespace lesson14

// ---- main ----------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson14.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson14;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0, batch = kBatchPerRank, timeout_s = 0;  // 0: the defaults below
  course::Cli cli("lesson14_distributed_failures",
                  "Lesson 14: lesson 09's distributed job when ranks fail. Run plainly, it fails "
                  "ranks of jobs it starts and measures how the others end; started by torchrun "
                  "(WORLD_SIZE set), it is one rank.", options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs, as a rank (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch, "samples per rank per step", 1, 60000);
  cli.add_option("--timeout", timeout_s, "seconds to wait for a rank (0 = 120 as a rank, 5 for "
                 "the jobs it starts, 3 with --quick)", 0, 86400);
  if (auto code = cli.parse(argc, argv)) return *code;

  const std::optional<course::RankInfo> job = course::rank_from_environment();
  RankDevice choice{options.device, ""};
  if (job) {  // one rank per device, by one rule on every rank; the host's cores shared out
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    choice = rank_device(options.device, course::cuda_device_count(), *job, visible ? visible : "");
    options.device = choice.device;
    if (options.threads == 0) options.threads = std::max(1, course::available_cores() / job->local_world_size);
  }
  const torch::Device device = course::start_lesson(options);  // prints the device first
  if (!choice.reason.empty()) std::cout << "(" << choice.reason << ")\n";
  const auto folder = course::find_fashion_mnist(options.data_dir);  // every rank reads it
  course::Verdict verdict;
  if (!job) {  // run plainly: the failures, measured
    fail_ranks(device.is_cuda() ? "cuda" : "cpu", options.data_dir,
               timeout_s > 0 ? timeout_s : options.quick ? 3 : kFailTimeoutSeconds, options.seed, verdict);
    return verdict.finish("lesson 14 on " + device.str());
  }
  if (backend_for(device).empty()) {
    throw course::CourseError("this build has no c10d backend for " + device.str(),
                              "Gloo needs libgloo-dev at build time, NCCL a CUDA LibTorch");
  }
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  if (options.quick) train = {train.images.slice(0, 0, kQuickSamples), train.labels.slice(0, 0, kQuickSamples)};
  rank_job(*job, device, train, epochs > 0 ? epochs : options.quick ? 1 : kEpochs, batch,
           options.seed, std::chrono::seconds(timeout_s > 0 ? timeout_s : kTimeoutSeconds), verdict);
  return verdict.finish("lesson 14 rank " + std::to_string(job->rank) + " of " +
                        std::to_string(job->world_size) + " on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
