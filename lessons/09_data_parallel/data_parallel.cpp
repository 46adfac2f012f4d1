// Lesson 09 — data parallelism: DataParallel's four steps written out, then distributed training
// with one process per device on PyTorch's own engine, c10d (Gloo on the CPU, NCCL on CUDA).
//
// You will learn:
//   - part 1, one process: what Python's nn.DataParallel does each step. Replicate (clone the
//     model onto every device), scatter (split the batch), parallel apply (one thread per
//     replica), gather (outputs back onto one device); the loss's backward then runs through
//     every replica and their gradients are summed onto the master copy. It equals one model on
//     the whole batch, and it is measured: the clone every step, and one thread feeding every
//     device, are why PyTorch recommends DistributedDataParallel instead;
//   - part 2, one process per device: the same binary is one rank of a c10d job whenever
//     WORLD_SIZE is set, as PyTorch's launcher sets it. The ranks meet at a TCPStore, rank 0's
//     parameters are broadcast, every rank takes its own shard of one shuffled order, and the
//     gradients are all-reduced as one flat buffer (lesson 11's flat parameters make it one
//     collective, the way DDP's buckets do), so every rank's Adam takes the same step;
//   - a rank that dies or never arrives ends the job with a clear error within --timeout.
//
// Run:    build/bin/lesson09_data_parallel [--device ...] [--epochs N] [--batch-size N]
//             (one process: part 1, then part 2 as a job of one rank)
//         torchrun --no-python --nproc-per-node 2 build/bin/lesson09_data_parallel
//             (each process is one rank; Debian's 1.13 launcher: python3 -m
//             torch.distributed.run --no_python --nproc_per_node 2 --redirects 1 --tee 1 ...)
// Checks: part 1's loss and gradients equal one model's on the whole batch (tolerance by dtype);
//         in part 2 every rank holds bitwise identical parameters after every step (checksums
//         compared across ranks); for the first kCheckedSteps steps the ranks' summed gradient
//         equals one process's gradient over the global batch from the same parameters
//         (tolerance by dtype); at the end the ranks have learnt what one process with the
//         global batch learns (loss and accuracy within kLossMargin, kAccuracyMargin); test
//         accuracy reaches lesson 05's bar. Every rank prints its own verdict. Exit 0 PASS, 1 FAIL (a check, or a rank lost), 2 bad flag,
//         environment, data or rendezvous.
#include "data_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>    // defines: c10d::HashStore (one process)
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>  // defines: c10d::PrefixStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>     // defines: c10d::TCPStore (the rendezvous)
#ifdef GPU_LESSONS_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // defines: c10d::ProcessGroupGloo
#endif
#ifdef GPU_LESSONS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // defines: c10d::ProcessGroupNCCL
#endif
#ifdef GPU_LESSONS_WITH_CUDA
#include <torch/nn/parallel/data_parallel.h>  // defines: torch::nn::parallel::data_parallel
#endif

#include "common/cli.h"      // defines: Cli, start_lesson, available_cores
#include "common/device.h"   // defines: cuda_device_count, synchronize, describe
#include "common/timing.h"   // defines: Stopwatch, median
#include "common/verdict.h"  // defines: Verdict, CourseError

namespace lesson09 {

constexpr std::int64_t kPixels = 28 * 28;

// ---- part 1: DataParallel, written out --------------------------------------------------------
torch::nn::Sequential make_model(std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kPixels, 128), torch::nn::ReLU(),
                               torch::nn::Linear(128, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 10));
}

namespace {

// Waits for every device in `devices` (replicas may sit on several GPUs) before a clock read.
void synchronize_all(const std::vector<torch::Device>& devices) {
  for (const auto& d : devices) course::synchronize(d);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

//! [data-parallel-step]
StepResult data_parallel_step(torch::nn::Sequential& model, const torch::Tensor& images,
                              const torch::Tensor& labels,
                              const std::vector<torch::Device>& devices) {
  const torch::Device master = model->parameters().front().device();
  std::vector<torch::Device> all = devices;
  all.push_back(master);
  const int n = static_cast<int>(devices.size());
  StepResult result;
  auto clock = std::chrono::steady_clock::now();
  auto lap = [&](double& phase) {
    synchronize_all(all);
    phase = seconds_since(clock);
    clock = std::chrono::steady_clock::now();
  };

  // 1. Replicate: a deep copy of the master model on each replica's device, every step (the
  //    master's parameters change every step, so last step's copies are stale).
  std::vector<torch::nn::Sequential> replicas;
  for (const auto& d : devices) {
    replicas.push_back(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone(d)));
  }
  lap(result.seconds.replicate);

  // 2. Scatter: the batch split along dimension 0, each chunk copied to its replica's device.
  std::vector<torch::Tensor> chunks = images.chunk(n, /*dim=*/0);
  for (int i = 0; i < n; ++i) chunks[i] = chunks[i].to(devices[i], /*non_blocking=*/true);
  lap(result.seconds.scatter);

  // 3. Parallel apply: one thread per replica (LibTorch's own parallel_apply does the same, on
  //    its thread pool), each queueing its replica's forward with that replica's GPU made
  //    current. Each output's autograd graph leads back to its replica's parameters. (A CPU
  //    replica's matmuls then run on one core each: its thread is already one of the pool's.)
  std::vector<torch::Tensor> outputs(n);
  at::parallel_for(0, n, /*grain_size=*/1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      c10::DeviceGuard on_device(devices[i]);
      outputs[i] = replicas[i]->forward(chunks[i]);
    }
  });
  lap(result.seconds.apply);

  // 4. Gather: every output back onto the master's device, in batch order. cat and to() are
  //    differentiable, so backward will route each chunk's gradient to its replica.
  for (auto& out : outputs) out = out.to(master);
  const torch::Tensor logits = torch::cat(outputs, /*dim=*/0);
  lap(result.seconds.gather);

  // The loss on the master device, then one backward through all replicas.
  result.loss = torch::nn::functional::cross_entropy(logits, labels.to(master));
  result.loss.backward();
  lap(result.seconds.backward);

  // The gradients land on the replicas' parameters: sum them onto the master's.
  std::vector<torch::Tensor> params = model->parameters();
  std::vector<std::vector<torch::Tensor>> replica_params;
  for (auto& replica : replicas) replica_params.push_back(replica->parameters());
  for (size_t p = 0; p < params.size(); ++p) {
    torch::Tensor sum = torch::zeros_like(params[p]);
    for (const auto& rp : replica_params) sum += rp[p].grad().to(master);
    params[p].mutable_grad() = sum;
    result.gradients.push_back(sum);
  }
  lap(result.seconds.reduce);
  return result;
}
//! [data-parallel-step]

StepResult single_model_step(torch::nn::Sequential& model, const torch::Tensor& images,
                             const torch::Tensor& labels) {
  const torch::Device device = model->parameters().front().device();
  model->zero_grad();
  StepResult result;
  course::Stopwatch watch(device);
  result.loss = torch::nn::functional::cross_entropy(model->forward(images.to(device)),
                                                     labels.to(device));
  result.loss.backward();
  for (const auto& p : model->parameters()) result.gradients.push_back(p.grad().clone());
  result.seconds.apply = watch.seconds();
  return result;
}

// ---- part 2: the rendezvous and the group (c10d) ----------------------------------------------
namespace {

// The value of an environment variable, or nullptr.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int env_int(const char* name, int fallback, int min, int max) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long value = std::strtol(v, &end, 10);
  if (*end != '\0' || value < min || value > max) {
    throw course::UsageError(std::string(name) + "=" + v + " is not a whole number in [" +
                                 std::to_string(min) + ", " + std::to_string(max) + "]",
                             "let torchrun set it, or set it to the right value");
  }
  return static_cast<int>(value);
}

}  // namespace

//! [rank-from-environment]
std::optional<RankInfo> rank_from_environment() {
  if (env("WORLD_SIZE") == nullptr) return std::nullopt;  // a plain run: one process
  RankInfo info;
  info.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 16);
  if (env("RANK") == nullptr) {
    throw course::UsageError("WORLD_SIZE is set but RANK is not",
                             "launch with torchrun --no-python, which sets both for every rank");
  }
  info.rank = env_int("RANK", 0, 0, info.world_size - 1);
  info.local_rank = env_int("LOCAL_RANK", info.rank, 0, info.world_size - 1);
  info.local_world_size = env_int("LOCAL_WORLD_SIZE", info.world_size, 1, info.world_size);
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  info.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  info.agent_store = agent != nullptr && std::string(agent) == "True";
  info.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20);
  return info;
}
//! [rank-from-environment]

//! [rank-device]
RankDevice rank_device(const std::string& requested, int gpus, const RankInfo& info,
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

std::string device_identity(const torch::Device& device) {
  if (!device.is_cuda()) return "cpu";
  for (const auto& gpu : course::list_gpus()) {
    if (gpu.index == device.index()) return device.str() + " " + gpu.uuid;
  }
  return device.str();
}

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

//! [meet-the-others]
void meet_the_others(c10d::Store& store, const RankInfo& info, const torch::Device& device,
                     std::chrono::milliseconds timeout) {
  // Every rank says which device it took, then waits for every other rank's word: the one wait
  // of the rendezvous, with the one timeout.
  const std::string mine = device_identity(device);
  store.set("device/" + std::to_string(info.rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < info.world_size; ++r) keys.push_back("device/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    int arrived = 0;
    for (const auto& key : keys) arrived += store.check({key}) ? 1 : 0;
    throw course::CourseError(
        "rank " + std::to_string(info.rank) + " gave up waiting for the other ranks at " +
            info.master_addr + ":" + std::to_string(info.master_port) + ": " +
            std::to_string(arrived) + " of " + std::to_string(info.world_size) +
            " arrived within " + std::to_string(timeout.count() / 1000) + " s",
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

//! [connect-store]
c10::intrusive_ptr<c10d::Store> connect_store(const RankInfo& info,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(info.master_port);
  // Under torchrun the launcher's agent already hosts the store and every rank is a client;
  // otherwise rank 0 hosts it. Nobody waits for the others here: meet_the_others() does, once.
  // (LibTorch 1.13's server gives up waiting for its workers without a word, after which the
  // next wait of the job started its own timeout.)
  options.isServer = !info.agent_store && info.rank == 0;
  options.numWorkers = info.world_size;
  options.waitWorkers = false;
  options.timeout = timeout;
  const std::string where = info.master_addr + ":" + std::to_string(info.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
  } catch (const std::exception& e) {
    const std::string message = course::error_message(e);
    const auto has = [&](const char* s) { return message.find(s) != std::string::npos; };
    if (has("in use") || has("EADDRINUSE")) {
      throw course::CourseError("rank 0 cannot host the rendezvous: port " +
                                    std::to_string(info.master_port) + " is in use (" + message + ")",
                                "pick a free port: torchrun --master-port P, or MASTER_PORT=P");
    }
    throw course::CourseError("rank " + std::to_string(info.rank) +
                                  " cannot reach the rendezvous at " + where + ": " + message,
                              "check MASTER_ADDR/MASTER_PORT (torchrun --rdzv-endpoint), that "
                              "rank 0 runs, and that no firewall blocks the port");
  }
  // Keys of this attempt only: a restarted job does not read the last attempt's leftovers.
  return c10::make_intrusive<c10d::PrefixStore>(
      "/lesson09/attempt_" + std::to_string(info.restart_count), store);
}
//! [connect-store]

std::string backend_for(const torch::Device& device, std::string* why_not) {
  std::string why;
  if (device.is_cuda()) {
#ifdef GPU_LESSONS_WITH_NCCL
    return "nccl";
#else
    why = "this build has no NCCL (needs a CUDA LibTorch and nccl.h)";
#endif
  } else {
#ifdef GPU_LESSONS_WITH_GLOO
    return "gloo";
#else
    why = "this build has no Gloo (Gloo's headers were not found: install libgloo-dev)";
#endif
  }
  if (why_not != nullptr) *why_not = why;
  return "";
}

//! [make-group]
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout) {
  std::string why;
  const std::string backend = backend_for(device, &why);
  if (backend.empty()) {
    throw course::CourseError("no communication backend for " + device.str() + ": " + why,
                              "run the ranks on the device this build supports (--device)");
  }
  try {
#ifdef GPU_LESSONS_WITH_NCCL
    if (backend == "nccl") {
      // NCCL: collectives run on the GPU, over NVLink or the network, on their own stream.
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = 2 * timeout;  // NCCL's watchdog aborts the process: wait_within first
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
    }
#endif
#ifdef GPU_LESSONS_WITH_GLOO
    // Gloo: collectives on CPU tensors, over TCP between the ranks (loopback on one host). The
    // group connects to every other rank now, through the addresses they publish in the store.
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
#endif
  } catch (const std::exception& e) {
    throw course::CourseError("rank " + std::to_string(rank) + " could not form the " + backend +
                                  " group of " + std::to_string(world_size) + ": " +
                                  course::error_message(e),
                              "a rank never arrived or died at start-up: start all ranks within "
                              "--timeout, and read the other ranks' output");
  }
  throw course::CourseError("no communication backend for " + device.str(), "");
}
//! [make-group]

// ---- part 2: sharding and the collectives ---------------------------------------------------
//! [shard]
torch::Tensor epoch_order(std::int64_t samples, std::uint64_t seed, int epoch) {
  // Its own generator, seeded from the seed and the epoch only: every rank draws the same order
  // without talking to the others.
  auto generator = at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
  return torch::randperm(samples, generator, torch::kLong);
}

std::int64_t steps_per_epoch(std::int64_t samples, int world_size, std::int64_t batch_per_rank) {
  const std::int64_t global = world_size * batch_per_rank;
  return (samples + global - 1) / global;
}

torch::Tensor shard_indices(const torch::Tensor& order, std::int64_t step, int rank,
                            int world_size, std::int64_t batch_per_rank) {
  // Global step s takes order[s*W*B, (s+1)*W*B); rank r takes the r-th B of those. One process
  // with batch W*B takes the very same samples in that step.
  const std::int64_t start = (step * world_size + rank) * batch_per_rank;
  const std::int64_t n = order.size(0);
  return order.slice(0, std::min(start, n), std::min(start + batch_per_rank, n));
}
//! [shard]

//! [wait-within]
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

int ranks_answering(course::CommGroup& group, const torch::Device& device,
                    std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> one{torch::ones({1}, torch::TensorOptions().device(device))};
  wait_within(group, *group.allreduce(one), device, timeout);
  return static_cast<int>(one[0].item<float>());
}

//! [collectives]
void broadcast_parameters(course::CommGroup& group, torch::Tensor& flat_values,
                          std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> tensors{flat_values};
  c10d::BroadcastOptions options;
  options.rootRank = 0;
  wait_within(group, *group.broadcast(tensors, options), flat_values.device(), timeout);
}

void allreduce_gradients(course::CommGroup& group, torch::Tensor& flat_gradients,
                         std::chrono::milliseconds timeout) {
  // One collective for the whole model: every parameter's gradient is a view into this tensor.
  std::vector<torch::Tensor> tensors{flat_gradients};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  wait_within(group, *group.allreduce(tensors, options), flat_gradients.device(), timeout);
}
//! [collectives]

std::uint64_t checksum(const torch::Tensor& tensor) {
  const torch::Tensor bytes = tensor.detach().to(torch::kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(bytes.data_ptr());
  const std::size_t size = bytes.numel() * bytes.element_size();
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a, 64 bits
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ p[i]) * 1099511628211ULL;
  return hash;
}

std::pair<std::uint64_t, std::uint64_t> min_max_across_ranks(course::CommGroup& group,
                                                             std::uint64_t value,
                                                             const torch::Device& device,
                                                             std::chrono::milliseconds timeout) {
  // int64 holds the 64 bits; the order it sorts them in does not matter, only equality does.
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  std::int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  std::vector<torch::Tensor> lo{torch::full({1}, bits, opts)}, hi{torch::full({1}, bits, opts)};
  c10d::AllreduceOptions min_op, max_op;
  min_op.reduceOp = c10d::ReduceOp::MIN;
  max_op.reduceOp = c10d::ReduceOp::MAX;
  wait_within(group, *group.allreduce(lo, min_op), device, timeout);
  wait_within(group, *group.allreduce(hi, max_op), device, timeout);
  const std::int64_t a = lo[0].item<std::int64_t>(), b = hi[0].item<std::int64_t>();
  std::uint64_t ua = 0, ub = 0;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  return {ua, ub};
}

// ---- part 2: the training loop ----------------------------------------------------------------
namespace {
// make_trainer seeds the global generator, then draws the initial parameters from it. Ranks
// that are threads of one process (the tests, the benchmark) share that generator: one at a time.
lesson11::Trainer seeded_trainer(const torch::Device& device, std::uint64_t seed) {
  static std::mutex generator;
  std::lock_guard<std::mutex> lock(generator);
  return lesson11::make_trainer(device, seed);
}
}  // namespace

torch::Tensor gradient_of_global_batch(lesson11::Trainer& trainer, const course::ImageSet& train,
                                       const torch::Tensor& indices, const torch::Device& device) {
  const torch::Tensor kept = trainer.flat.gradients.clone();
  trainer.flat.gradients.zero_();
  const torch::Tensor x = train.images.reshape({-1, kPixels}).index_select(0, indices).to(device);
  const torch::Tensor y = train.labels.index_select(0, indices).to(device);
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  (torch::nn::functional::cross_entropy(trainer.model->forward(x), y, sum) /
   static_cast<double>(indices.size(0))).backward();
  const torch::Tensor gradient = trainer.flat.gradients.clone();
  trainer.flat.gradients.copy_(kept);
  return gradient;
}

//! [train-data-parallel]
DistributedRun train_data_parallel(course::CommGroup* group, int rank, int world_size,
                                   const course::ImageSet& train, int epochs,
                                   std::int64_t batch_per_rank, const torch::Device& device,
                                   std::uint64_t seed, bool print_epochs,
                                   std::chrono::milliseconds timeout) {
  DistributedRun run{seeded_trainer(device, seed), {}, {}, {}};
  lesson11::Trainer& t = run.trainer;
  run.trail = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  // Every rank starts from rank 0's parameters (the seed already agrees; DDP makes sure).
  if (group != nullptr) broadcast_parameters(*group, t.flat.values, timeout);

  const torch::Tensor images = train.images.reshape({-1, kPixels});
  const std::int64_t samples = images.size(0);
  const std::int64_t global_batch = world_size * batch_per_rank;
  const std::int64_t steps = steps_per_epoch(samples, world_size, batch_per_rank);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    t.model->train();
    course::Stopwatch watch(device);
    const torch::Tensor order = epoch_order(samples, seed, epoch);
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (std::int64_t step = 0; step < steps; ++step) {
      const torch::Tensor idx = shard_indices(order, step, rank, world_size, batch_per_rank);
      // The samples of this global step on all ranks together (fewer in the last step).
      const std::int64_t in_step = std::min(global_batch, samples - step * global_batch);
      t.flat.gradients.zero_();
      if (idx.numel() > 0) {
        const torch::Tensor x = images.index_select(0, idx).to(device);
        const torch::Tensor y = train.labels.index_select(0, idx).to(device);
        // Each rank's loss is its samples' share of the global batch's mean, so the SUM of
        // the ranks' gradients is the gradient of the global mean. (DDP divides the sum by the
        // world size instead: the same thing when every rank has a full batch.)
        const torch::Tensor loss = torch::nn::functional::cross_entropy(
                                       t.model->forward(x), y,
                                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
                                   static_cast<double>(in_step);
        loss.backward();
        loss_sum += loss.detach() * static_cast<double>(in_step);
      }
      if (group != nullptr) {
        allreduce_gradients(*group, t.flat.gradients, timeout);  // waits for all ranks
        if (epoch == 0 && step < kCheckedSteps) {  // the promise, checked: one process's gradient
          const torch::Tensor global = order.slice(0, step * global_batch, step * global_batch + in_step);
          run.gradient_diffs.push_back(course::relative_diff(
              t.flat.gradients, gradient_of_global_batch(t, train, global, device)));
        }
      }
      t.optimizer->step();  // the same gradients and the same state: the same step everywhere
      // Each step's parameters, as the sum of their bits (int64 on the device: no sync).
      run.trail += t.flat.values.view(torch::kInt).sum(torch::kLong);
    }
    if (group != nullptr) allreduce_gradients(*group, loss_sum, timeout);  // all samples' loss
    EpochStats stats;
    stats.mean_loss = loss_sum.item<double>() / static_cast<double>(samples);
    stats.seconds = watch.seconds();
    stats.samples = samples;
    run.epochs.push_back(stats);
    if (print_epochs) {
      std::printf("  rank %d/%d epoch %d/%d  loss %.4f  %6.3f s  %9.0f samples/s (all ranks)\n",
                  rank, world_size, epoch + 1, epochs, stats.mean_loss, stats.seconds,
                  static_cast<double>(samples) / stats.seconds);
      std::fflush(stdout);
    }
  }
  return run;
}
//! [train-data-parallel]

}  // namespace lesson09

// ---- main ----------------------------------------------------------------------------------------
namespace {
using namespace lesson09;

std::string fmt(const char* format, double a, double b = 0, double c = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, format, a, b, c);
  return buf;
}

// Part 1: one DataParallel step against one model on the whole batch, then the phases timed.
void part1(const torch::Device& device, const course::ImageSet& train, std::uint64_t seed,
           bool quick, course::Verdict& verdict) {
  std::cout << "\n== Part 1: DataParallel in one process ==\n";
  std::vector<torch::Device> devices;
  const int gpus = device.is_cuda() ? course::cuda_device_count() : 0;
  if (gpus >= 2) {
    for (int i = 0; i < gpus; ++i) devices.emplace_back(torch::kCUDA, i);
  } else {
    devices.assign(kReplicas, device);  // the replicas share the one device
  }
  std::cout << devices.size() << " replicas on";
  for (const auto& d : devices) std::cout << ' ' << d.str();
  std::cout << (device.is_cpu() ? " (one thread each)\n" : "\n");

  const torch::Tensor images = train.images.slice(0, 0, kPart1Batch).reshape({-1, kPixels});
  const torch::Tensor labels = train.labels.slice(0, 0, kPart1Batch);
  torch::nn::Sequential model = make_model(seed);
  model->to(device);
  torch::nn::Sequential reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
      model->clone(device));  // the same parameters, to take the whole batch alone

  const StepResult dp = data_parallel_step(model, images, labels, devices);
  const StepResult one = single_model_step(reference, images, labels);
  const double tol = course::tolerance_for(torch::kFloat);  // the same sums, in another order
  const double loss_diff = course::max_rel_diff(dp.loss, one.loss);
  const double grad_diff = course::max_rel_diff(dp.gradients, one.gradients);
  std::printf("loss %.6f (DataParallel) vs %.6f (one model): relative diff %.2e\n",
              dp.loss.item<double>(), one.loss.item<double>(), loss_diff);
  std::printf("gradients of all %zu parameters: max relative diff %.2e (fp32 tolerance %.0e)\n",
              dp.gradients.size(), grad_diff, tol);
  verdict.check(loss_diff <= tol, "DataParallel's loss equals one model's on the whole batch",
                fmt("relative diff %.2e", loss_diff));
  verdict.check(grad_diff <= tol, "the summed replica gradients equal one model's",
                fmt("max relative diff %.2e", grad_diff));

#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {
    // LibTorch's own data_parallel: the same four steps (one GPU: it just calls forward).
    std::vector<torch::Device> gpu_list;
    for (int i = 0; i < std::max(gpus, 1); ++i) gpu_list.emplace_back(torch::kCUDA, i);
    torch::NoGradGuard no_grad;
    const torch::Tensor x = images.to(device);
    const torch::Tensor ours = model->forward(x);
    const torch::Tensor theirs = torch::nn::parallel::data_parallel(model, x, gpu_list, device);
    const double d = (ours - theirs).abs().max().item<double>();
    std::printf("torch::nn::parallel::data_parallel on %zu GPU(s): output max abs diff %.2e\n",
                gpu_list.size(), d);
    verdict.check(d <= tol, "torch::nn::parallel::data_parallel gives the model's output",
                  fmt("max abs diff %.2e", d));
  }
#else
  std::cout << "torch::nn::parallel::data_parallel: (skipped: needs CUDA)\n";
#endif

  // Why DDP is preferred: time each phase over several steps.
  const int runs = quick ? 5 : kPart1TimedSteps;
  std::vector<PhaseSeconds> timed;
  for (int i = 0; i < runs + 2; ++i) {
    StepResult r = data_parallel_step(model, images, labels, devices);
    if (i >= 2) timed.push_back(r.seconds);  // two warm-up steps
  }
  std::vector<double> one_model;
  for (int i = 0; i < runs + 2; ++i) {
    StepResult r = single_model_step(reference, images, labels);
    if (i >= 2) one_model.push_back(r.seconds.apply);
  }
  auto med = [&](double PhaseSeconds::*field) {
    std::vector<double> v;
    for (const auto& s : timed) v.push_back(s.*field);
    return course::median(v) * 1e3;
  };
  std::vector<double> totals;
  for (const auto& s : timed) totals.push_back(s.total());
  const double total = course::median(totals) * 1e3;
  std::printf("one step of %lld images, median of %d (ms):\n", static_cast<long long>(kPart1Batch),
              runs);
  std::printf("  replicate %.3f | scatter %.3f | apply %.3f | gather %.3f | backward %.3f | "
              "reduce %.3f | total %.3f\n",
              med(&PhaseSeconds::replicate), med(&PhaseSeconds::scatter), med(&PhaseSeconds::apply),
              med(&PhaseSeconds::gather), med(&PhaseSeconds::backward), med(&PhaseSeconds::reduce),
              total);
  std::printf("  one model, whole batch: %.3f ms\n", course::median(one_model) * 1e3);
  std::printf("  copying the model every step costs %.0f%% of the step; the master thread "
              "replicates, scatters, gathers and reduces for every device in turn\n",
              100.0 * med(&PhaseSeconds::replicate) / total);
  std::cout << "  DistributedDataParallel (part 2) copies the model once, and each process feeds "
               "its own device\n";
}

// Part 2 as one rank of a job (`launched`: started as one, else a plain run's job of one) over
// `backend`: train, compare across ranks and with the reference, evaluate.
void part2(const RankInfo& info, bool launched, const std::string& backend,
           const torch::Device& device, const course::ImageSet& train,
           const course::ImageSet& test, int epochs, std::int64_t batch, std::uint64_t seed,
           std::chrono::milliseconds timeout, double bar, course::Verdict& verdict) {
  std::printf("\n== Part 2: distributed data parallel, rank %d of %d (local rank %d) ==\n",
              info.rank, info.world_size, info.local_rank);
  c10::intrusive_ptr<c10d::Store> store;
  if (!launched) {
    store = c10::make_intrusive<c10d::HashStore>();  // a job of one: nobody to meet
  } else {
    std::printf("rendezvous at %s:%d (%s), timeout %lld s\n", info.master_addr.c_str(),
                info.master_port, info.agent_store ? "the launcher's store" :
                (info.rank == 0 ? "hosted by this rank" : "hosted by rank 0"),
                static_cast<long long>(timeout.count() / 1000));
    std::fflush(stdout);
    store = connect_store(info, timeout);
  }
  meet_the_others(*store, info, device, timeout);  // everyone is here, one backend for all
  auto group = make_group(store, info.rank, info.world_size, device, timeout);
  // NCCL connects at its first collective: only an answer from every rank says the group works.
  const int answered = ranks_answering(*group, device, timeout);
  std::printf("%s group of %d connected (%d rank(s) answered a first all-reduce); batch %lld per "
              "rank, %lld per global step\n",
              backend.c_str(), info.world_size, answered, static_cast<long long>(batch),
              static_cast<long long>(batch * info.world_size));
  std::fflush(stdout);

  DistributedRun run;
  try {
    run = train_data_parallel(group.get(), info.rank, info.world_size, train, epochs, batch,
                              device, seed, /*print_epochs=*/true, timeout);
  } catch (const std::exception& e) {
    // A peer died or stopped answering: Gloo sees the connection close (at once) or the
    // collective time out. Nothing is left to compare; end now, non-zero.
    course::print_error("rank " + std::to_string(info.rank) + " lost the job during training: " +
                            course::error_message(e),
                        "another rank died or stopped: its own output says why");
    verdict.check(false, "every rank finished training", "a collective failed");
    const int code = verdict.finish("lesson 09 rank " + std::to_string(info.rank));
    std::cout.flush();
    std::fflush(stdout);
    std::fflush(stderr);
    // A group whose peer is gone may block in its destructor; there is nothing left to save.
    std::_Exit(code);
  }

  // Every rank's parameters after every step (the trail) and at the end (a hash of their bytes).
  const std::uint64_t mine = checksum(run.trainer.flat.values);
  const auto [lo, hi] = min_max_across_ranks(*group, mine, device, timeout);
  const auto trail = static_cast<std::uint64_t>(run.trail.item<std::int64_t>());
  const auto [trail_lo, trail_hi] = min_max_across_ranks(*group, trail, device, timeout);
  course::shutdown_group(*group);  // the last collective is done: end the group in order
  std::printf("parameter checksum %016llx, after every step %016llx; across %d ranks: %s\n",
              static_cast<unsigned long long>(mine), static_cast<unsigned long long>(trail),
              info.world_size, lo == hi && trail_lo == trail_hi ? "all equal" : "DIFFERENT");
  verdict.check(lo == hi && trail_lo == trail_hi,
                "every rank holds bitwise identical parameters after every step",
                "checksums compared across ranks");

  const double accuracy = lesson11::evaluate(run.trainer.model, test, device);
  if (info.world_size > 1) {
    double worst = 0;
    for (const double d : run.gradient_diffs) worst = std::max(worst, d);
    std::printf("summed gradient vs one process's over the global batch, steps 1-%zu: largest "
                "relative difference %.2e (tolerance %.0e)\n",
                run.gradient_diffs.size(), worst, course::tolerance_for(torch::kFloat));
    verdict.check(worst <= course::tolerance_for(torch::kFloat),
                  "the ranks' summed gradient is one process's over the global batch",
                  fmt("relative difference %.2e", worst));
    // The reference: this process alone, batch world_size x batch, the same global order.
    std::cout << "reference: one process, batch " << batch * info.world_size << ", same order\n";
    DistributedRun ref = train_data_parallel(nullptr, 0, 1, train, epochs,
                                             batch * info.world_size, device, seed, false);
    std::printf("parameters after epoch %d vs the reference: relative difference %.2e (they "
                "drift apart: see the page)\n",
                epochs, course::relative_diff(run.trainer.flat.values, ref.trainer.flat.values));
    const double loss = run.epochs.back().mean_loss, ref_loss = ref.epochs.back().mean_loss;
    const double ref_accuracy = lesson11::evaluate(ref.trainer.model, test, device);
    std::printf("final loss %.4f vs %.4f, test accuracy %.4f vs %.4f (the reference)\n", loss,
                ref_loss, accuracy, ref_accuracy);
    verdict.check(std::abs(loss - ref_loss) <= kLossMargin * ref_loss &&
                      std::abs(accuracy - ref_accuracy) <= kAccuracyMargin,
                  "and they learn the same to the end: loss and accuracy",
                  fmt("within %.0f%% and %.2f", kLossMargin * 100, kAccuracyMargin));
  }
  std::printf("test accuracy: %.4f\n", accuracy);
  verdict.check(accuracy >= bar, "test accuracy reaches lesson 05's bar",
                fmt("%.4f vs bar %.2f", accuracy, bar));
}

}  // namespace

int lesson_main(int argc, char** argv) {
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  int batch = static_cast<int>(kBatchPerRank);
  int timeout_s = kTimeoutSeconds;
  course::Cli cli("lesson09_data_parallel",
                  "Lesson 09: DataParallel written out, then distributed data parallel on c10d "
                  "(one rank per process whenever WORLD_SIZE is set, as torchrun sets it).",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch, "samples per rank per step", 1, 60000);
  cli.add_option("--timeout", timeout_s,
                 "seconds to wait for a rank (rendezvous and every collective)", 1, 86400);
  if (auto code = cli.parse(argc, argv)) return *code;

  const std::optional<RankInfo> job = rank_from_environment();
  RankDevice choice{options.device, ""};
  if (job) {
    // One rank per device, by one rule on every rank; the CPU cores are shared out.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    choice = rank_device(options.device, course::cuda_device_count(), *job,
                         visible != nullptr ? visible : "");
    options.device = choice.device;
    if (options.threads == 0) options.threads = std::max(1, course::available_cores() / job->local_world_size);
  }
  const torch::Device device = course::start_lesson(options);
  if (!choice.reason.empty()) std::cout << "(" << choice.reason << ")\n";
  const auto folder = course::find_fashion_mnist(options.data_dir);
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  const course::ImageSet test = course::load_fashion_mnist(folder, /*train=*/false);
  if (options.quick) train = lesson11::take(train, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  const bool full_run = !options.quick && epochs >= kEpochs;
  const double bar = full_run ? kAccuracyBar : kQuickAccuracyBar;
  const auto timeout = std::chrono::milliseconds(1000LL * timeout_s);

  course::Verdict verdict;
  std::string why;
  const std::string backend = backend_for(device, &why);
  if (backend.empty()) {
    std::cout << "part 2 needs a c10d backend for " << device.str() << ": " << why << '\n';
  }
  if (!job) {
    part1(device, train, options.seed, options.quick, verdict);
    if (backend.empty()) {
      verdict.waive("distributed training: " + why);
      return verdict.finish("lesson 09 on " + device.str());
    }
    std::cout << "\n(no WORLD_SIZE in the environment: part 2 runs as a job of one rank; "
                 "torchrun --no-python --nproc-per-node N runs N)\n";
    part2(RankInfo{}, /*launched=*/false, backend, device, train, test, epochs, batch,
          options.seed, timeout, bar, verdict);
    return verdict.finish("lesson 09 on " + device.str());
  }
  if (backend.empty()) {
    throw course::CourseError("rank " + std::to_string(job->rank) + " cannot train on " +
                                  device.str() + ": " + why,
                              "build against a LibTorch with the backend, or pick --device");
  }
  part2(*job, /*launched=*/true, backend, device, train, test, epochs, batch, options.seed,
        timeout, bar, verdict);
  return verdict.finish("lesson 09 rank " + std::to_string(job->rank) + " of " +
                        std::to_string(job->world_size) + " on " + device.str());
}
