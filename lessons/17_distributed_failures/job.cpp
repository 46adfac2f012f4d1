// job.cpp: lesson 17's job of ranks that ends when one fails (job.h): lesson 09's loop, its
// collectives waiting with a deadline, the rendezvous that waits once, one device rule.
#include "job.h"

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
#include <thread>

#include "common/device.h"        // defines: cuda_device_count
#include "common/timing.h"        // defines: Stopwatch (lesson 09's epoch time)
#include "common/verdict.h"       // defines: CourseError, UsageError, error_message
#include "distributed/sampler.h"  // defines: epoch_order, shard_indices (lesson 09's shards)

namespace lesson17 {

// ---- lesson 09's job, with what this lesson changes in it ---------------------------------------
// The tutorial's ANN (common/ann.h; lesson 09 declares it again, layers in the same order: the same
// seed, the same weights). Lesson 09's shards: course::epoch_order and course::shard_indices.
using course::ANN;

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
// Lesson 05's loop as rank `rank` of `world_size`. Added: `losses`, and `check`, given the step's
// samples (all ranks') once the gradients are summed, before Adam.
ANN train_data_parallel(course::CommGroup& group, int rank, int world_size,
                        const course::ImageSet& train, int epochs, std::int64_t batch_per_rank,
                        const torch::Device& device, std::uint64_t seed,
                        std::chrono::milliseconds timeout, std::vector<double>* losses,
                        const StepCheck& check) {
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

// A rank's device by rank_device's rule, and its share of the host's cores.
std::string take_rank_device(course::CommonOptions& options, const course::RankInfo& job) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const RankDevice choice =
      rank_device(options.device, course::cuda_device_count(), job, visible ? visible : "");
  options.device = choice.device;
  if (options.threads == 0)
    options.threads = std::max(1, course::available_cores() / job.local_world_size);
  return choice.reason;
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

// ---- a rank joins its job ----------------------------------------------------------------------
c10::intrusive_ptr<course::CommGroup> join_job(const course::RankInfo& info,
                                               const torch::Device& device,
                                               std::chrono::milliseconds timeout) {
  std::printf("rank %d of %d (local rank %d): rendezvous at %s:%d, timeout %lld s\n", info.rank,
              info.world_size, info.local_rank, info.master_addr.c_str(), info.master_port,
              static_cast<long long>(timeout.count() / 1000));
  std::fflush(stdout);  // said now, not when the buffer fills: a job's clock starts at this line
  auto store = connect_store(info, timeout);
  meet_the_others(*store, info, device, timeout);  // everyone is here, one backend for all
  return make_group(store, info.rank, info.world_size, device, timeout);  // it keeps the store
}

void connect_group(course::CommGroup& group, const course::RankInfo& info,
                   const torch::Device& device, std::chrono::milliseconds timeout) {
  torch::Tensor answered = torch::ones({1}, torch::TensorOptions().device(device));
  allreduce_sum(group, answered, timeout);
  std::printf("%s group of %d connected (%d rank(s) answered a first all-reduce)\n",
              device.is_cuda() ? "nccl" : "gloo", info.world_size, answered.item<int>());
}

}  // namespace lesson17
