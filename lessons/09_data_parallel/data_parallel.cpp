// Lesson 09 — data parallelism: the tutorial's DataParallel and DistributedDataParallel, in C++.
//
// You will learn: part 1, `nn.DataParallel(model)`: lesson 05's loop with its forward pass made by
//   LibTorch's torch::nn::parallel::data_parallel, then what that does inside, written out, checked
//   against one model and timed (why DDP is preferred); part 2, `torchrun`, `init_process_group`
//   and `DistributedDataParallel` on c10d (TCPStore, Gloo or NCCL): rank 0's parameters broadcast,
//   a shard each of one order, gradients all-reduced; a dead or missing rank ends it in --timeout.
// Run:    build/bin/lesson09_data_parallel [--device ...] [--epochs N] [--batch-size N]
//           [--timeout S] [--data-dir DIR] [--quick]
//         torchrun --no-python --nproc-per-node 2 build/bin/lesson09_data_parallel  (a rank each)
// Checks: part 1 learns, its steps equal one model's; every rank ends with rank 0's parameters, bit
//         for bit, at lesson 05's test accuracy. Exit 0 PASS, 1 FAIL (or a rank lost), 2 bad input.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, at::parallel_for

#ifdef GPU_LESSONS_WITH_CUDA
#include <torch/nn/parallel/data_parallel.h>  // defines: torch::nn::parallel::data_parallel
#endif

#include <algorithm>
#include <cstdio>

#include "common/ann.h"           // defines: make_train_loader, test_accuracy, FashionMNIST
#include "common/cli.h"           // defines: Cli, start_lesson, available_cores
#include "common/compare.h"       // defines: max_rel_diff, tolerance_for, gradients, checksum
#include "common/data.h"          // defines: ImageSet, load_fashion_mnist_splits
#include "common/device.h"        // defines: cuda_device_count
#include "common/report.h"        // defines: format
#include "common/timing.h"        // defines: Stopwatch, time_median, describe_ms
#include "common/verdict.h"       // defines: Verdict, CourseError, print_error, report_error
#include "distributed/c10d.h"     // defines: CommGroup (Gloo and NCCL ranks), shutdown_group
#include "distributed/launch.h"   // defines: rank_from_environment, join_job, exit_lost_job
#include "distributed/sampler.h"  // defines: epoch_order, shard_indices (DistributedSampler's work)

// What LibTorch's C++ API lacks of torch.distributed, in a file of its own: init_process_group
// and DistributedDataParallel's broadcast and all-reduce.
#include "distributed_data_parallel.h"

namespace lesson09 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 9;             // the first weights and every epoch's order
constexpr int kWorkers = 2;                    // part 1: lesson 05's DataLoader(num_workers=2)
constexpr int kReplicas = 2;                   // part 1 on one device: replicas, a thread each
constexpr std::int64_t kPart1Batch = 512;      // part 1: one batch, split across the replicas
constexpr int kPart1TimedSteps = 20;           // part 1: steps timed (5 with --quick)
constexpr int kEpochs = 5;                     // part 2: lesson 05's loop, 5 epochs,
constexpr std::int64_t kBatchPerRank = 64;     // batches of 64 on every rank (W x 64 a step),
constexpr double kLearningRate = 1e-3;         // and Adam
constexpr int kTimeoutSeconds = 120;           // a rank dead or missing: give up after this
constexpr double kAccuracyBar = 0.85;          // lesson 05's, after kEpochs on all 60,000 images
constexpr std::int64_t kQuickSamples = 10000;  // --quick: one epoch on the first 10,000 images,
constexpr double kQuickAccuracyBar = 0.70;     // and a lower bar (part 1's, after its one epoch)

// ---- the model: lesson 05's ANN, cloneable ---------------------------------------------------
//! [model]
// Lesson 05's ANN, plus what DataParallel's replicate needs: clone(device), which only a Cloneable
// has. It copies the struct, empties it, calls reset() to make the layers anew, copies values in.
struct ANNImpl : torch::nn::Cloneable<ANNImpl> {  // added: Cloneable, where lesson 05 has Module
  ANNImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        out(register_module("out", torch::nn::Linear(64, 10))),
        relu(register_module("relu", torch::nn::ReLU())) {}
  void reset() override {  // added: the constructor's four layers, made again in a clone
    fc1 = register_module("fc1", torch::nn::Linear(28 * 28, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
    out = register_module("out", torch::nn::Linear(64, 10));
    relu = register_module("relu", torch::nn::ReLU());
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), -1});  // [B, 1, 28, 28] (part 2: [B, 28, 28]) -> [B, 784]
    x = relu(fc1(x));
    x = relu(fc2(x));
    return out(x);  // logits: CrossEntropyLoss applies the softmax itself
  }
  torch::nn::Linear fc1, fc2, out;
  torch::nn::ReLU relu;
};
TORCH_MODULE(ANN);  // ANN: a shared pointer to an ANNImpl, hence model->forward(x)
//! [model]

// ---- part 1: nn.DataParallel, one process ------------------------------------------------------
//! [data-parallel-forward]
// outputs = model(features) through nn.DataParallel: LibTorch's function (a CUDA build) splits the
// batch over every GPU, gathers the outputs where the labels are; no GPU: the model as it is.
torch::Tensor data_parallel_forward(ANN& model, const torch::Tensor& features) {
#ifdef GPU_LESSONS_WITH_CUDA
  if (features.is_cuda())
    return torch::nn::parallel::data_parallel(model, features, /*devices=*/{}, features.device());
#endif
  return model->forward(features);
}
//! [data-parallel-forward]
//! [data-parallel-loop]
// Lesson 05's training for one epoch, its model wrapped: model = nn.DataParallel(ANN()).to(device).
ANN train_one_epoch(course::FashionMNIST train_ds, torch::Device device, std::uint64_t seed) {
  torch::manual_seed(seed);
  ANN model;
  model->to(device);  // nn.DataParallel(ANN()).to(device): the wrapping is the forward call below
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  auto train_loader = course::make_train_loader(train_ds, kBatchPerRank, kWorkers);
  model->train();
  double total_loss = 0, batches = 0;
  for (auto& [features, labels] : *train_loader) {
    features = features.to(device);
    labels = labels.to(device);
    torch::Tensor outputs = data_parallel_forward(model, features);  // was model->forward(features)
    torch::Tensor loss = criterion(outputs, labels);
    optimizer.zero_grad();
    loss.backward();  // on 2+ GPUs, through every replica into the model's own parameters
    optimizer.step();
    total_loss += loss.item<double>();
    ++batches;
  }
  std::printf("Epoch 1, Loss: %.4f\n", total_loss / batches);
  return model;
}
//! [data-parallel-loop]

//! [data-parallel-step]
// What data_parallel does inside, then the loss and backward(): a replica of `model` on each of
// `devices` (a device may repeat: replicas then share it). The gradients end on `model`.
torch::Tensor data_parallel_step(ANN& model, const torch::Tensor& images,
                                 const torch::Tensor& labels,
                                 const std::vector<torch::Device>& devices) {
  const torch::Device master = model->parameters().front().device();
  const int n = static_cast<int>(devices.size());
  // 1. Replicate: a deep copy of the model on each device, every step (last step's are stale).
  std::vector<ANN> replicas;
  for (const auto& d : devices)
    // clone(d) returns a generic Module; dynamic_pointer_cast makes it our ANNImpl again
    replicas.emplace_back(std::dynamic_pointer_cast<ANNImpl>(model->clone(d)));
  // 2. Scatter: the batch split along dimension 0, each chunk copied to its replica's device.
  std::vector<torch::Tensor> chunks = images.chunk(n, /*dim=*/0), outputs(n);
  for (int i = 0; i < n; ++i) chunks[i] = chunks[i].to(devices[i], /*non_blocking=*/true);
  // 3. Parallel apply: one thread per replica, each with its replica's device made current.
  // at::parallel_for(0, n, 1, f) splits 0..n among LibTorch's threads, calling f(begin, end).
  at::parallel_for(0, n, /*grain_size=*/1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      c10::DeviceGuard on_device(devices[i]);
      outputs[i] = replicas[i]->forward(chunks[i]);
    }
  });
  // 4. Gather onto the model's device, in order (backward() takes each chunk back to its replica).
  for (auto& out : outputs) out = out.to(master);
  torch::Tensor loss = torch::nn::functional::cross_entropy(torch::cat(outputs), labels.to(master));
  loss.backward();  // through every replica, into each replica's own parameters' .grad()
  // 5. The replicas' gradients summed onto the model's own (the clones share no memory with it).
  std::vector<torch::Tensor> params = model->parameters();
  for (size_t p = 0; p < params.size(); ++p) {
    params[p].mutable_grad() = torch::zeros_like(params[p]);  // p.grad = torch.zeros_like(p)
    for (auto& replica : replicas)
      params[p].mutable_grad() += replica->parameters()[p].grad().to(master);
  }
  return loss;
}
//! [data-parallel-step]

// ---- part 2: torchrun, init_process_group, DistributedDataParallel: a process per device, c10d --
// The words of part 2 (tutorial 001's DDP snippet):
//   - a job is several processes, each a *rank* (0, 1, ...; rank 0 is the first) of *world_size*;
//     the *local rank* is its number on its own machine, which picks its GPU. torchrun starts
//     them and tells each its numbers in environment variables (RANK, WORLD_SIZE, LOCAL_RANK).
//   - init_process_group: the ranks find each other through a *store*, a small key-value server
//     that rank 0 runs (a TCPStore at MASTER_ADDR:MASTER_PORT: the *rendezvous*), then form a
//     *process group*, LibTorch's c10d object that runs collectives between them over a backend:
//     Gloo (CPU tensors, over TCP) or NCCL (GPU tensors, NVIDIA's library).
//   - a *collective* is a call every rank makes together: *broadcast* copies rank 0's tensor into
//     every rank's; *all-reduce* replaces every rank's tensor by the sum over the ranks.
//   - DDP(model) = a broadcast of the parameters at the start and an all-reduce of the gradients
//     after each backward(); LibTorch has no DDP class, so distributed_data_parallel.cpp writes
//     those two calls. c10::intrusive_ptr<T> is how c10d hands out its objects: a shared pointer.

//! [train-data-parallel]
// Lesson 05's loop as rank `rank` of `world_size` (a group of one: one process).
ANN train_data_parallel(course::CommGroup& group, int rank, int world_size,
                        const course::ImageSet& train, int epochs, std::int64_t batch_per_rank,
                        const torch::Device& device, std::uint64_t seed,
                        std::chrono::milliseconds timeout) {
  torch::manual_seed(seed);  // the same weights on every rank (the broadcast makes sure)
  ANN model;
  model->to(device);  // model = SimpleNN().to(device), lesson 05's ANN
  broadcast_parameters(group, model->parameters(), timeout);  // model = DDP(model)
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
      allreduce_gradients(group, model->parameters(), timeout);  // waits for every rank
      optimizer.step();  // the same gradients and the same state: the same step on every rank
    }
    allreduce_sum(group, loss_sum, timeout);  // every rank's samples
    const double seconds = watch.seconds(), loss = loss_sum.item<double>() / samples;
    std::printf("  rank %d/%d epoch %d/%d  loss %.4f  %6.3f s  %9.0f samples/s (all ranks)\n", rank,
                world_size, epoch + 1, epochs, loss, seconds, samples / seconds);
    std::fflush(stdout);
  }
  return model;
}
//! [train-data-parallel]

// ---- the program ----------------------------------------------------------------------------
// Part 1: the tutorial's DataParallel in lesson 05's loop for an epoch; then inside it, and timed.
void part1(const torch::Device& device, const course::ImageSet& train, const course::ImageSet& test,
           std::uint64_t seed, int runs, course::Verdict& verdict) {
  const int gpus = device.is_cuda() ? course::cuda_device_count() : 0;
  std::printf("\n== Part 1: nn.DataParallel, %s ==\n",
              gpus > 0 ? (std::to_string(gpus) + " GPU(s)").c_str() : "no GPU: the model alone");
  ANN model = train_one_epoch(course::FashionMNIST(train), device, seed);
  const double accuracy = course::test_accuracy(model, test, device);
  std::printf("Test Accuracy: %.4f\n", accuracy);
  verdict.check(accuracy >= kQuickAccuracyBar, "lesson 05's loop through data_parallel learns",
                std::to_string(accuracy) + " vs bar " + std::to_string(kQuickAccuracyBar));
  // Inside: a replica on each GPU when there are 2 or more, else kReplicas on the one device.
  std::vector<torch::Device> devices(gpus >= 2 ? gpus : kReplicas, device);
  for (int i = 0; gpus >= 2 && i < gpus; ++i) devices[i] = torch::Device(torch::kCUDA, i);
  const torch::Tensor images = train.images.slice(0, 0, kPart1Batch);
  const torch::Tensor labels = train.labels.slice(0, 0, kPart1Batch);
  const torch::Tensor one_loss =  // the model alone on the whole batch, then the same step split
      torch::nn::functional::cross_entropy(model->forward(images.to(device)), labels.to(device));
  const auto one_grads = torch::autograd::grad({one_loss}, model->parameters());
  const torch::Tensor dp_loss = data_parallel_step(model, images, labels, devices);
  const double tol = course::tolerance_for(torch::kFloat);  // the same sums, in another order
  const double grad_diff = course::max_rel_diff(course::gradients(model->parameters()), one_grads);
  std::printf("\nInside: %zu replicas, loss %.6f vs %.6f alone; gradients %.2e apart (tol. %.0e)\n",
              devices.size(), dp_loss.item<double>(), one_loss.item<double>(), grad_diff, tol);
  verdict.check(course::max_rel_diff(dp_loss, one_loss) <= tol, "the loss equals one model's");
  verdict.check(grad_diff <= tol, "the summed replica gradients equal one model's");
  if (device.is_cuda()) {  // LibTorch's function against the model alone, on the same batch
    torch::NoGradGuard no_grad;
    const torch::Tensor x = images.to(device);
    const double d = course::max_rel_diff(data_parallel_forward(model, x), model->forward(x));
    std::printf("torch::nn::parallel::data_parallel: max relative diff %.2e\n", d);
    verdict.check(d <= tol, "torch::nn::parallel::data_parallel gives the model's output");
  }
  // Why DDP instead: a copy of the model every step, and one thread feeding every replica.
  const auto step = [&] { data_parallel_step(model, images, labels, devices); };
  const auto replicate = [&] {
    for (const auto& d : devices) model->clone(d);
  };
  const course::Timing whole = course::time_median(step, device, /*warmup=*/2, runs);
  const course::Timing copies = course::time_median(replicate, device, /*warmup=*/2, runs);
  std::printf("a step of %lld images: %s, of which replicate %s (%.0f%%)\n",
              static_cast<long long>(kPart1Batch), course::describe_ms(whole).c_str(),
              course::describe_ms(copies).c_str(), 100 * copies.median_s / whole.median_s);
  std::cout << course::timing_note({whole, copies});
  std::printf("\n(no WORLD_SIZE: part 2 as a job of one rank; torchrun starts N)\n");
}

// Part 2 as a rank of a job (a plain run's: a job of one): train, compare with rank 0, evaluate.
void part2(const course::RankInfo& info, const torch::Device& device, const course::ImageSet& train,
           const course::ImageSet& test, int epochs, std::int64_t batch, std::uint64_t seed,
           std::chrono::milliseconds timeout, double bar, course::Verdict& verdict) {
  std::printf("\n== Part 2: distributed data parallel, rank %d of %d (local rank %d) ==\n",
              info.rank, info.world_size, info.local_rank);
  std::fflush(stdout);  // said now (lesson 17 times a failed job from this line)
  // dist.init_process_group(backend): the store, then the group; no rank missing, or exit 2.
  const c10::intrusive_ptr<course::CommGroup> group =
      course::join_job(info, [&] { return init_process_group(info, device, timeout); });
  std::printf("%s group of %d formed, timeout %lld s\n", device.is_cuda() ? "nccl" : "gloo",
              info.world_size, static_cast<long long>(timeout.count() / 1000));
  ANN model{nullptr};
  std::vector<torch::Tensor> mine(1), rank0(1);
  try {
    model = train_data_parallel(*group, info.rank, info.world_size, train, epochs, batch, device,
                                seed, timeout);
    mine[0] = torch::nn::utils::parameters_to_vector(model->parameters()).detach();
    rank0[0] = mine[0].clone();
    group->broadcast(rank0)->wait(timeout);  // rank 0's parameters, to compare with (broadcast()
                                             // starts it; wait() blocks until it is done)
  } catch (const std::exception& e) {        // a rank died (its socket closed) or stopped answering
    // never returns: prints what happened and ends this process with the verdict's exit code
    course::exit_lost_job(info.rank, e, verdict, "lesson 09 rank " + std::to_string(info.rank));
  }
  course::shutdown_group(*group);  // the last collective is done: end the group in order
  std::printf("parameter checksum %016llx\n",
              static_cast<unsigned long long>(course::checksum(mine[0])));
  const torch::Tensor here = mine[0].cpu(), there = rank0[0].cpu();
  const std::int64_t apart = (here != there).sum().item<std::int64_t>();  // parameters drifted
  verdict.check(apart == 0, "this rank holds rank 0's parameters",
                apart == 0 ? ""
                           : course::format("%lld of %lld differ, by at most %.2e",
                                            static_cast<long long>(apart),
                                            static_cast<long long>(here.numel()),
                                            (here - there).abs().max().item<double>()));
  const double accuracy = course::test_accuracy(model, test, device);
  std::printf("Test Accuracy: %.4f\n", accuracy);
  verdict.check(accuracy >= bar, "test accuracy reaches lesson 05's bar",
                std::to_string(accuracy) + " vs bar " + std::to_string(bar));
}

}  // namespace lesson09

// ---- main ------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson09.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson09;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0, batch = kBatchPerRank, timeout_s = kTimeoutSeconds;  // epochs 0: 5, 1 if quick
  course::Cli cli("lesson09_data_parallel",
                  "Lesson 09: DataParallel, then DDP on c10d (a rank per process under torchrun).",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs (0 = 5, or 1 with --quick)", 0, 1000);
  cli.add_option("--batch-size", batch, "samples per rank per step", 1, 60000);
  cli.add_option("--timeout", timeout_s, "seconds to wait for a rank", 1, 86400);
  if (auto code = cli.parse(argc, argv)) return *code;

  // Where this process stands: torchrun's variables, or none (a plain run).
  const std::optional<course::RankInfo> job = course::rank_from_environment();
  course::RankInfo info = job.value_or(course::RankInfo{});
  if (!job) info.master_port = course::free_tcp_port();  // a plain run: a job of one, on this host
  const bool any_gpu = options.device == "auto" || options.device == "cuda";
  if (job && any_gpu && course::cuda_device_count() > 0)  // torch.cuda.set_device(local_rank)
    options.device = "cuda:" + std::to_string(info.local_rank);
  if (job && options.threads == 0)  // the host's cores shared out among its ranks
    options.threads = std::max(1, course::available_cores() / info.local_world_size);
  const torch::Device device = course::start_lesson(options);  // prints the device first
  const auto [folder, train, test] =
      course::load_fashion_mnist_splits(options.data_dir, options.quick, kQuickSamples);
  if (epochs == 0) epochs = options.quick ? 1 : kEpochs;
  const double bar = !options.quick && epochs >= kEpochs ? kAccuracyBar : kQuickAccuracyBar;
  course::Verdict verdict;
  if (!job) part1(device, train, test, options.seed, options.quick ? 5 : kPart1TimedSteps, verdict);
  part2(info, device, train, test, epochs, batch, options.seed, std::chrono::seconds(timeout_s),
        bar, verdict);
  return verdict.finish("lesson 09 rank " + std::to_string(info.rank) + " of " +
                        std::to_string(info.world_size) + " on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
