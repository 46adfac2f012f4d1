// Lesson 09 — data parallelism: the tutorial's DataParallel and DistributedDataParallel, in C++.
//
// You will learn:
//   - part 1, `nn.DataParallel(model)`: LibTorch has only a function for it (CUDA only), so its
//     steps are written out (replicate, scatter, parallel apply, gather; the replicas' gradients
//     summed onto the model), checked equal to one model and timed: why DDP is preferred;
//   - part 2, `dist.init_process_group(backend='nccl')` and `DistributedDataParallel(model)`: run
//     by torchrun (WORLD_SIZE set), this program is one rank of a c10d job. The ranks meet at a
//     TCPStore, form a Gloo (CPU) or NCCL (CUDA) group, start from rank 0's parameters, take their
//     shard of one shuffled order and all-reduce the gradients after backward(): the rest of
//     lesson 05's loop remains the same. A rank that dies or never arrives ends the job within
//     --timeout (lesson 14 makes each such failure a clear error, and measures them).
// Run:    build/bin/lesson09_data_parallel [--device ...] [--epochs N] [--batch-size N]
//             [--timeout S] [--data-dir DIR] [--quick]   (part 1, then part 2 as a job of one)
//         torchrun --no-python --nproc-per-node 2 build/bin/lesson09_data_parallel  (a rank each)
// Checks: part 1's loss and gradients equal one model's (tolerance by dtype); in part 2 every
//         rank ends with rank 0's parameters, bit for bit, and learns what one process with the
//         global batch learns (kLossMargin, kAccuracyMargin); test accuracy reaches lesson 05's
//         bar. Each rank prints its verdict. Exit 0 PASS, 1 FAIL (a check, or a rank lost), 2 bad
//         flag, data or rendezvous.
#include <torch/csrc/distributed/c10d/HashStore.hpp>    // defines: c10d::HashStore (a job of one)
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>  // defines: c10d::PrefixStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>     // defines: c10d::TCPStore (the rendezvous)
#include <torch/torch.h>  // defines: torch::nn, torch::optim, at::parallel_for
#ifdef GPU_LESSONS_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // defines: c10d::ProcessGroupGloo
#endif
#ifdef GPU_LESSONS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // defines: c10d::ProcessGroupNCCL
#endif
#ifdef GPU_LESSONS_WITH_CUDA
#include <torch/nn/parallel/data_parallel.h>  // defines: torch::nn::parallel::data_parallel
#endif

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <mutex>

#include "common/c10d.h"     // defines: CommGroup (Gloo's and NCCL's base class), shutdown_group
#include "common/cli.h"      // defines: Cli, start_lesson, available_cores
#include "common/compare.h"  // defines: max_rel_diff, relative_diff, tolerance_for, checksum
#include "common/data.h"     // defines: ImageSet, find_fashion_mnist, load_fashion_mnist
#include "common/device.h"   // defines: cuda_device_count
#include "common/launch.h"   // defines: RankInfo, rank_from_environment (torchrun's variables)
#include "common/timing.h"   // defines: Stopwatch, time_median, describe_ms
#include "common/verdict.h"  // defines: Verdict, CourseError, print_error, report_error

namespace lesson09 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 9;             // the first weights and every epoch's order
constexpr int kReplicas = 2;                   // part 1 on one device: replicas, a thread each
constexpr std::int64_t kPart1Batch = 512;      // part 1: one batch, split across the replicas
constexpr int kPart1TimedSteps = 20;           // part 1: steps timed (5 with --quick)
constexpr int kEpochs = 5;                     // part 2: lesson 05's loop, 5 epochs,
constexpr std::int64_t kBatchPerRank = 64;     // batches of 64 on every rank (W x 64 a step),
constexpr double kLearningRate = 1e-3;         // and Adam
constexpr int kTimeoutSeconds = 120;           // a rank dead or missing: give up after this
constexpr double kAccuracyBar = 0.85;          // lesson 05's, after kEpochs on all 60,000 images
constexpr std::int64_t kQuickSamples = 10000;  // --quick: one epoch on the first 10,000 images,
constexpr double kQuickAccuracyBar = 0.70;     // and a lower bar
// The ranks and one process with the global batch are compared by what they learn: their
// parameters drift apart (each step's rounding differences carried on; the page shows it).
constexpr double kLossMargin = 0.02;      // final epoch's loss, relative
constexpr double kAccuracyMargin = 0.01;  // test accuracy, absolute

// ---- the model: lesson 05's ANN -----------------------------------------------------------------
//! [model]
// Cloneable, as DataParallel's replicate needs: clone(device) makes a fresh module with reset()
// and copies the parameters into it, on that device.
struct ANNImpl : torch::nn::Cloneable<ANNImpl> {
  ANNImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(28 * 28, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
    out = register_module("out", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), -1});  // [B, 28, 28] -> [B, 784]
    return out(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(ANN);
//! [model]

ANN make_model(std::uint64_t seed) {
  static std::mutex generator;  // ranks that are threads of one process (the tests) take turns
  std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(seed);
  return ANN();
}

// ---- part 1: DataParallel, written out --------------------------------------------------------
//! [data-parallel-step]
// nn.DataParallel(model)(images), the loss and backward(): a replica of `model` on each of
// `devices` (a device may repeat: replicas then share it). The gradients end on `model`.
torch::Tensor data_parallel_step(ANN& model, const torch::Tensor& images,
                                 const torch::Tensor& labels, const std::vector<torch::Device>& devices) {
  const torch::Device master = model->parameters().front().device();
  const int n = static_cast<int>(devices.size());
  // 1. Replicate: a deep copy of the model on each device, every step (the model's parameters
  //    change every step, so last step's copies are stale).
  std::vector<ANN> replicas;
  for (const auto& d : devices) replicas.emplace_back(std::dynamic_pointer_cast<ANNImpl>(model->clone(d)));
  // 2. Scatter: the batch split along dimension 0, each chunk copied to its replica's device.
  std::vector<torch::Tensor> chunks = images.chunk(n, /*dim=*/0), outputs(n);
  for (int i = 0; i < n; ++i) chunks[i] = chunks[i].to(devices[i], /*non_blocking=*/true);
  // 3. Parallel apply: one thread per replica, each with its replica's device made current.
  at::parallel_for(0, n, /*grain_size=*/1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      c10::DeviceGuard on_device(devices[i]);
      outputs[i] = replicas[i]->forward(chunks[i]);
    }
  });
  // 4. Gather: the outputs onto the model's device, in batch order. cat and to() are
  //    differentiable: backward routes each chunk's gradient back to its replica.
  for (auto& out : outputs) out = out.to(master);
  torch::Tensor loss = torch::nn::functional::cross_entropy(torch::cat(outputs), labels.to(master));
  loss.backward();  // through every replica; their gradients summed onto the model's
  std::vector<torch::Tensor> params = model->parameters();
  for (size_t p = 0; p < params.size(); ++p) {
    params[p].mutable_grad() = torch::zeros_like(params[p]);
    for (auto& replica : replicas) params[p].mutable_grad() += replica->parameters()[p].grad().to(master);
  }
  return loss;
}
//! [data-parallel-step]

// The reference: the same step on one model and the whole batch.
torch::Tensor single_model_step(ANN& model, const torch::Tensor& images, const torch::Tensor& labels) {
  const torch::Device device = model->parameters().front().device();
  model->zero_grad();
  torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images.to(device)),
                                                            labels.to(device));
  loss.backward();
  return loss;
}

std::vector<torch::Tensor> gradients(ANN& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad());
  return grads;
}

// ---- part 2: dist.init_process_group, one process per device (c10d) ----------------------------
// "nccl" for CUDA tensors, "gloo" for CPU tensors; "" when this build has not got it.
std::string backend_for([[maybe_unused]] const torch::Device& device) {
#ifdef GPU_LESSONS_WITH_NCCL
  if (device.is_cuda()) return "nccl";
#endif
#ifdef GPU_LESSONS_WITH_GLOO
  if (device.is_cpu()) return "gloo";
#endif
  return "";
}

//! [init-process-group]
// The rendezvous, as init_process_group's env:// makes it: a TCPStore at MASTER_ADDR:MASTER_PORT,
// hosted by rank 0 (by the launcher's agent under torchrun); this attempt's keys under a prefix.
c10::intrusive_ptr<c10d::Store> connect_store(const course::RankInfo& info,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(info.master_port);
  options.isServer = !info.agent_store && info.rank == 0;
  options.numWorkers = info.world_size;
  options.waitWorkers = false;  // the group's start-up waits for the other ranks, once
  options.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
    return c10::make_intrusive<c10d::PrefixStore>("attempt_" + std::to_string(info.restart_count), store);
  } catch (const std::exception& e) {
    throw course::CourseError("rank " + std::to_string(info.rank) + ": no rendezvous at " +
                                  info.master_addr + ":" + std::to_string(info.master_port) +
                                  ": " + course::error_message(e),
                              "start every rank with the same MASTER_ADDR and MASTER_PORT");
  }
}

// The group of `world_size` ranks over `store`: NCCL for CUDA tensors, Gloo for CPU tensors. It
// waits at most `timeout` for a rank: Gloo then fails the collective, NCCL's watchdog the process.
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout) {
  try {
#ifdef GPU_LESSONS_WITH_NCCL
    if (device.is_cuda()) {  // collectives on the GPU, over NVLink or the network
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
    }
#endif
#ifdef GPU_LESSONS_WITH_GLOO
    if (device.is_cpu()) {  // collectives on CPU tensors over TCP; it connects every rank now
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
    }
#endif
  } catch (const std::exception& e) {
    throw course::CourseError("rank " + std::to_string(rank) + " could not form the " +
                                  backend_for(device) + " group of " + std::to_string(world_size) +
                                  ": " + course::error_message(e),
                              "a rank never arrived or died at start-up: start all ranks within "
                              "--timeout, and read the other ranks' output");
  }
  throw course::CourseError("this build has no c10d backend for " + device.str(),
                            "Gloo needs libgloo-dev at build time, NCCL a CUDA LibTorch");
}
//! [init-process-group]

// ---- part 2: DistributedSampler and DistributedDataParallel -----------------------------------
//! [shard]
// The epoch's shuffled order, from a generator seeded with the seed and the epoch only: every rank
// draws the same order without a word to the others (DistributedSampler's set_epoch).
torch::Tensor epoch_order(std::int64_t samples, std::uint64_t seed, int epoch) {
  auto generator = at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
  return torch::randperm(samples, generator, torch::kLong);
}

std::int64_t steps_per_epoch(std::int64_t samples, int world_size, std::int64_t batch_per_rank) {
  return (samples + world_size * batch_per_rank - 1) / (world_size * batch_per_rank);
}

// Global step s takes order[s*W*B, (s+1)*W*B); rank r takes the r-th B of those, so one process
// with batch W*B takes the very same samples in step s. The last step may leave a rank none.
torch::Tensor shard_indices(const torch::Tensor& order, std::int64_t step, int rank,
                            int world_size, std::int64_t batch_per_rank) {
  const std::int64_t start = (step * world_size + rank) * batch_per_rank, n = order.size(0);
  return order.slice(0, std::min(start, n), std::min(start + batch_per_rank, n));
}
//! [shard]

//! [collectives]
// DistributedDataParallel(model) starts every rank from rank 0's parameters: a broadcast.
void broadcast_parameters(course::CommGroup& group, ANN& model, std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;  // the backend writes into the parameters themselves
  for (auto& p : model->parameters()) {
    std::vector<torch::Tensor> tensors{p};
    group.broadcast(tensors)->wait(timeout);  // from rank 0; Gloo gives up after `timeout`
  }
}

// Every rank's `tensor` summed, in place, on every rank.
void allreduce_sum(course::CommGroup& group, torch::Tensor& tensor, std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> tensors{tensor};
  group.allreduce(tensors)->wait(timeout);  // ReduceOp::SUM by default
}

// What DDP does after backward(): the gradients into one flat bucket (DDP's hold 25 MB; this
// model's 0.4 MB is one), one all-reduce, and each gradient copied back from the sum.
torch::Tensor allreduce_gradients(course::CommGroup& group, ANN& model,
                                  std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> params = model->parameters(), grads;
  for (const auto& p : params) {  // a rank with no samples this step adds zeros
    grads.push_back(p.grad().defined() ? p.grad().view(-1) : torch::zeros_like(p).view(-1));
  }
  torch::Tensor bucket = torch::cat(grads);
  allreduce_sum(group, bucket, timeout);
  for (std::int64_t i = 0, offset = 0; i < static_cast<std::int64_t>(params.size()); ++i) {
    params[i].mutable_grad() = bucket.slice(0, offset, offset + params[i].numel()).view_as(params[i]).clone();
    offset += params[i].numel();
  }
  return bucket;
}
//! [collectives]

//! [train-data-parallel]
// Lesson 05's loop as rank `rank` of `world_size`, each epoch's mean loss into `losses`; with no
// group (nullptr), one process with batch world_size x batch_per_rank: the reference.
ANN train_data_parallel(course::CommGroup* group, int rank, int world_size,
                        const course::ImageSet& train, int epochs, std::int64_t batch_per_rank,
                        const torch::Device& device, std::uint64_t seed,
                        std::chrono::milliseconds timeout, std::vector<double>& losses) {
  ANN model = make_model(seed);
  model->to(device);                                                   // model = ANN().to(device)
  if (group != nullptr) broadcast_parameters(*group, model, timeout);  // DistributedDataParallel(model)
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  const std::int64_t samples = train.images.size(0), global_batch = world_size * batch_per_rank;
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    course::Stopwatch watch(device);
    const torch::Tensor order = epoch_order(samples, seed, epoch);
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (std::int64_t step = 0; step < steps_per_epoch(samples, world_size, batch_per_rank); ++step) {
      const torch::Tensor idx = shard_indices(order, step, rank, world_size, batch_per_rank);
      const std::int64_t in_step = std::min(global_batch, samples - step * global_batch);
      optimizer.zero_grad();
      if (idx.numel() > 0) {
        torch::Tensor features = train.images.index_select(0, idx).to(device);
        torch::Tensor labels = train.labels.index_select(0, idx).to(device);
        // This rank's share of the global batch's mean loss: the ranks' gradients sum to the
        // gradient of that mean (DDP divides the sum by the world size: the same for full batches).
        torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(features), labels, sum) /
                             static_cast<double>(in_step);
        loss.backward();
        loss_sum += loss.detach() * static_cast<double>(in_step);
      }
      if (group != nullptr) allreduce_gradients(*group, model, timeout);  // waits for every rank
      optimizer.step();  // the same gradients and the same state: the same step on every rank
    }
    if (group != nullptr) allreduce_sum(*group, loss_sum, timeout);  // every rank's samples
    losses.push_back(loss_sum.item<double>() / static_cast<double>(samples));
    if (group != nullptr) {
      const double seconds = watch.seconds();
      std::printf("  rank %d/%d epoch %d/%d  loss %.4f  %6.3f s  %9.0f samples/s (all ranks)\n", rank,
                  world_size, epoch + 1, epochs, losses.back(), seconds, samples / seconds);
      std::fflush(stdout);
    }
  }
  return model;
}
//! [train-data-parallel]

double evaluate(ANN& model, const course::ImageSet& test, const torch::Device& device) {
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor predicted = std::get<1>(torch::max(model->forward(test.images.to(device)), 1));
  return (predicted == test.labels.to(device)).to(torch::kDouble).mean().item<double>();
}

// ---- the program ---------------------------------------------------------------------------------
// Part 1: one DataParallel step against one model on the whole batch, then both timed.
void part1(const torch::Device& device, const course::ImageSet& train, std::uint64_t seed,
           int runs, course::Verdict& verdict) {
  const int gpus = device.is_cuda() ? course::cuda_device_count() : 0;  // 2 or more: one each
  std::vector<torch::Device> devices;
  for (int i = 0; i < (gpus >= 2 ? gpus : kReplicas); ++i) {
    devices.push_back(gpus >= 2 ? torch::Device(torch::kCUDA, i) : device);
  }
  std::cout << "\n== Part 1: DataParallel in one process, " << devices.size() << " replicas on "
            << devices.front() << " .. " << devices.back() << " ==\n";
  const torch::Tensor images = train.images.slice(0, 0, kPart1Batch);
  const torch::Tensor labels = train.labels.slice(0, 0, kPart1Batch);
  ANN model = make_model(seed);
  model->to(device);
  ANN reference = std::dynamic_pointer_cast<ANNImpl>(model->clone(device));  // the same weights
  const torch::Tensor dp_loss = data_parallel_step(model, images, labels, devices);
  const torch::Tensor one_loss = single_model_step(reference, images, labels);
  const double tol = course::tolerance_for(torch::kFloat);  // the same sums, in another order
  const double grad_diff = course::max_rel_diff(gradients(model), gradients(reference));
  std::printf("loss %.6f (DataParallel) vs %.6f (one model); gradients: max relative diff %.2e "
              "(fp32 tolerance %.0e)\n", dp_loss.item<double>(), one_loss.item<double>(), grad_diff, tol);
  verdict.check(course::max_rel_diff(dp_loss, one_loss) <= tol, "DataParallel's loss is one model's");
  verdict.check(grad_diff <= tol, "the summed replica gradients equal one model's");
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {  // LibTorch's own function: the same steps (with one GPU, just forward)
    std::vector<torch::Device> gpu_list(devices.begin(), devices.begin() + std::max(gpus, 1));
    torch::NoGradGuard no_grad;
    const torch::Tensor x = images.to(device);
    const double d = course::max_rel_diff(
        torch::nn::parallel::data_parallel(model, x, gpu_list, device), model->forward(x));
    std::printf("torch::nn::parallel::data_parallel: max relative diff %.2e\n", d);
    verdict.check(d <= tol, "torch::nn::parallel::data_parallel gives the model's output");
  }
#else
  std::cout << "torch::nn::parallel::data_parallel: (skipped: needs CUDA)\n";
#endif
  // Why DDP instead: the copies every step, and one thread feeding every replica in turn.
  const course::Timing step = course::time_median(
      [&] { data_parallel_step(model, images, labels, devices); }, device, /*warmup=*/2, runs);
  const course::Timing copies = course::time_median(
      [&] { for (const auto& d : devices) model->clone(d); }, device, /*warmup=*/2, runs);
  const course::Timing alone = course::time_median(
      [&] { single_model_step(reference, images, labels); }, device, /*warmup=*/2, runs);
  std::printf("a step of %lld images: DataParallel %s, of which replicate %s (%.0f%%); one model "
              "alone %s\n", static_cast<long long>(kPart1Batch), course::describe_ms(step).c_str(),
              course::describe_ms(copies).c_str(), 100 * copies.median_s / step.median_s,
              course::describe_ms(alone).c_str());
}

// Part 2 as a rank of a job (`launched`, else a plain run's job of one): train, compare with rank
// 0 and with one process, evaluate.
void part2(const course::RankInfo& info, bool launched, const torch::Device& device,
           const course::ImageSet& train, const course::ImageSet& test, int epochs,
           std::int64_t batch, std::uint64_t seed, std::chrono::milliseconds timeout, double bar,
           course::Verdict& verdict) {
  std::printf("\n== Part 2: distributed data parallel, rank %d of %d (local rank %d) ==\n",
              info.rank, info.world_size, info.local_rank);
  std::fflush(stdout);
  // dist.init_process_group(backend): the store, then the group (a job of one meets nobody).
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  if (launched) store = connect_store(info, timeout);
  auto group = make_group(store, info.rank, info.world_size, device, timeout);
  std::printf("%s group of %d formed; batch %lld per rank, timeout %lld s\n",
              backend_for(device).c_str(), info.world_size, static_cast<long long>(batch),
              static_cast<long long>(timeout.count() / 1000));
  ANN model{nullptr};
  std::vector<double> losses;
  std::vector<torch::Tensor> mine(1), rank0(1);
  try {
    model = train_data_parallel(group.get(), info.rank, info.world_size, train, epochs, batch,
                                device, seed, timeout, losses);
    mine[0] = torch::nn::utils::parameters_to_vector(model->parameters()).detach();
    rank0[0] = mine[0].clone();
    group->broadcast(rank0)->wait(timeout);  // rank 0's parameters, to compare with
  } catch (const std::exception& e) {  // a rank died (its socket closed) or stopped answering
    course::print_error("rank " + std::to_string(info.rank) + " lost the job during training: " +
                            course::error_message(e), "another rank died or stopped: see its output");
    verdict.check(false, "every rank finished training");
    const int code = verdict.finish("lesson 09 rank " + std::to_string(info.rank));
    std::fflush(stdout);
    std::_Exit(code);  // a group whose peer is gone may block in its destructor: nothing to save
  }
  course::shutdown_group(*group);  // the last collective is done: end the group in order
  std::printf("parameter checksum %016llx, rank 0's %016llx\n",
              static_cast<unsigned long long>(course::checksum(mine[0])),
              static_cast<unsigned long long>(course::checksum(rank0[0])));
  verdict.check(torch::equal(mine[0].cpu(), rank0[0].cpu()), "this rank holds rank 0's parameters");
  const double accuracy = evaluate(model, test, device);
  if (info.world_size > 1) {  // the reference: one process, batch W x B, the same order
    std::vector<double> ref_losses;
    ANN ref = train_data_parallel(nullptr, 0, 1, train, epochs, batch * info.world_size, device,
                                  seed, timeout, ref_losses);
    const double ref_accuracy = evaluate(ref, test, device);
    std::printf("one process, batch %lld: parameters %.2e apart (relative); final loss %.4f vs "
                "%.4f, test accuracy %.4f vs %.4f\n", static_cast<long long>(batch * info.world_size),
                course::relative_diff(mine[0], torch::nn::utils::parameters_to_vector(ref->parameters())),
                losses.back(), ref_losses.back(), accuracy, ref_accuracy);
    verdict.check(std::abs(losses.back() - ref_losses.back()) <= kLossMargin * ref_losses.back() &&
                      std::abs(accuracy - ref_accuracy) <= kAccuracyMargin,
                  "the ranks learn what one process learns: loss and accuracy");
  }
  std::printf("Test Accuracy: %.4f\n", accuracy);
  verdict.check(accuracy >= bar, "test accuracy reaches lesson 05's bar",
                std::to_string(accuracy) + " vs bar " + std::to_string(bar));
}

}  // namespace lesson09

// ---- main ----------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson09.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson09;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0, batch = kBatchPerRank, timeout_s = kTimeoutSeconds;  // epochs 0: 5, 1 if quick
  course::Cli cli("lesson09_data_parallel",
                  "Lesson 09: DataParallel written out, then distributed data parallel on c10d "
                  "(one rank per process whenever WORLD_SIZE is set, as torchrun sets it).",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch, "samples per rank per step", 1, 60000);
  cli.add_option("--timeout", timeout_s, "seconds to wait for a rank", 1, 86400);
  if (auto code = cli.parse(argc, argv)) return *code;

  // Where this process stands: torchrun's variables, or none (a plain run).
  const std::optional<course::RankInfo> job = course::rank_from_environment();
  if (job && course::cuda_device_count() > 0 && (options.device == "auto" || options.device == "cuda")) {
    options.device = "cuda:" + std::to_string(job->local_rank);  // torch.cuda.set_device(local_rank)
  }
  if (job && options.threads == 0) {  // the host's cores shared out among its ranks
    options.threads = std::max(1, course::available_cores() / job->local_world_size);
  }
  const torch::Device device = course::start_lesson(options);  // prints the device first
  const auto folder = course::find_fashion_mnist(options.data_dir);
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  const course::ImageSet test = course::load_fashion_mnist(folder, /*train=*/false);
  if (options.quick) train = {train.images.slice(0, 0, kQuickSamples), train.labels.slice(0, 0, kQuickSamples)};
  if (epochs == 0) epochs = options.quick ? 1 : kEpochs;
  const double bar = !options.quick && epochs >= kEpochs ? kAccuracyBar : kQuickAccuracyBar;

  course::Verdict verdict;
  const std::string name = "lesson 09 " + (job ? "rank " + std::to_string(job->rank) + " of " +
                                                     std::to_string(job->world_size) + " " : "") +
                           "on " + device.str();
  if (!job) part1(device, train, options.seed, options.quick ? 5 : kPart1TimedSteps, verdict);
  if (backend_for(device).empty()) {  // this build cannot run part 2 on this device
    const std::string why = "this build has no c10d backend for " + device.str();
    if (job) throw course::CourseError(why, "Gloo needs libgloo-dev at build time, NCCL a CUDA LibTorch");
    verdict.waive("distributed training: " + why);
    return verdict.finish(name);
  }
  if (!job) std::cout << "\n(no WORLD_SIZE: part 2 as a job of one rank; torchrun starts N)\n";
  part2(job.value_or(course::RankInfo{}), job.has_value(), device, train, test, epochs, batch,
        options.seed, std::chrono::seconds(timeout_s), bar, verdict);
  return verdict.finish(name);
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
