// data_parallel.h: what lesson 09 teaches, callable from its tests and benchmarks.
// See data_parallel.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/c10d.h"  // defines: course::CommGroup (c10d::Backend, or ProcessGroup on 1.13)
#include "common/compare.h"  // defines: course::max_abs_diff, relative_diff, tolerance_for
#include "common/data.h"  // defines: course::ImageSet
#include "fast_training_loop.h"  // defines: lesson11's Mlp, Trainer, kLearningRate (the model trained)

namespace lesson09 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 9;
constexpr int kReplicas = 2;               // part 1 on the CPU: replicas, one thread each
constexpr std::int64_t kPart1Batch = 512;  // part 1: one batch, split across the replicas
constexpr int kPart1TimedSteps = 20;       // part 1: steps timed per phase (median)
constexpr int kEpochs = lesson11::kEpochs; // part 2: as lesson 05
constexpr std::int64_t kBatchPerRank = 64; // part 2: a global step takes world_size x this
constexpr int kTimeoutSeconds = 120;       // a rank that dies or never arrives: give up after this
constexpr double kAccuracyBar = lesson11::kAccuracyBar;
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = lesson11::kQuickSamples;
constexpr double kQuickAccuracyBar = lesson11::kQuickAccuracyBar;

// Part 2, what data parallelism promises exactly, whatever the CPU: from the same parameters,
// the ranks' summed gradient is one process's gradient over the global batch, up to the order
// of the sums (course::tolerance_for). Checked for the first few steps of every run.
constexpr int kCheckedSteps = 5;
// Where the two runs are compared as wholes, at the end: by what they learn. (Their parameters
// drift apart: each step carries the last-bit differences of the sums on, and Adam grows them
// where a gradient is near zero, since it divides each gradient by its own running size.)
constexpr double kLossMargin = 0.02;      // final epoch's loss, relative
constexpr double kAccuracyMargin = 0.01;  // test accuracy, absolute

// ---- part 1: DataParallel in one process --------------------------------------------------------
/// Lesson 05's 784-128-64-10 MLP as a Sequential: Sequential is Cloneable, which replicate needs.
torch::nn::Sequential make_model(std::uint64_t seed);

/// Seconds spent in each of DataParallel's steps.
struct PhaseSeconds {
  double replicate = 0;  ///< clone the master model onto every replica's device
  double scatter = 0;    ///< split the batch, one chunk per replica
  double apply = 0;      ///< forward on every replica at once, one thread each
  double gather = 0;     ///< outputs back onto the master's device, concatenated
  double backward = 0;   ///< loss and backward through every replica
  double reduce = 0;     ///< replicas' gradients summed onto the master's parameters
  double total() const { return replicate + scatter + apply + gather + backward + reduce; }
};

/// A training step's loss and the master parameters' gradients (in parameters() order).
struct StepResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> gradients;
  PhaseSeconds seconds;
};

/// One DataParallel step on `model` (left with the summed gradients), one replica per entry of
/// `devices` (a device may repeat: replicas then share it).
StepResult data_parallel_step(torch::nn::Sequential& model, const torch::Tensor& images,
                              const torch::Tensor& labels,
                              const std::vector<torch::Device>& devices);
/// The reference: the same step on one model and the whole batch.
StepResult single_model_step(torch::nn::Sequential& model, const torch::Tensor& images,
                             const torch::Tensor& labels);

// ---- part 2: one process per device (c10d) ------------------------------------------------------
/// Where this process stands in a job, as PyTorch's launcher (torchrun) tells it.
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;  ///< TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store
  int restart_count = 0;     ///< TORCHELASTIC_RESTART_COUNT
};
/// The job this process is a rank of, from its environment: nothing when WORLD_SIZE is unset (a
/// plain run); UsageError naming the variable when one is missing or out of range.
std::optional<RankInfo> rank_from_environment();

/// The device a rank of a launched job trains on: what start_lesson() is to resolve.
struct RankDevice {
  std::string device;  ///< "cpu", "cuda:N", or the request as given when no GPU is visible
  std::string reason;  ///< why the ranks train on the CPU although GPUs are visible; else empty
};
/// One rule, which every rank of a host applies to the same facts, so that all ranks land on the
/// same kind of device: `requested` is --device, `gpus` the GPUs this process sees,
/// `cuda_visible_devices` that variable ("" when unset).
///   - cpu and cuda:N are taken as given;
///   - auto or cuda with no GPU visible: as given (start_lesson falls back to the CPU, saying why);
///   - a GPU for every rank of the host (gpus >= local_world_size): cuda:<local_rank>;
///   - one GPU visible, and CUDA_VISIBLE_DEVICES naming one (a launcher gave each rank its own):
///     cuda:0;
///   - fewer GPUs than ranks: auto puts every rank on the CPU with the reason; cuda is a
///     UsageError naming the counts (NCCL needs a GPU for every rank).
RankDevice rank_device(const std::string& requested, int gpus, const RankInfo& info,
                       const std::string& cuda_visible_devices);

/// What names a rank's device across processes: "cpu", or "cuda:N GPU-<uuid>".
std::string device_identity(const torch::Device& device);
/// Why ranks on these devices (identities in rank order) cannot form one group: a mix of CPU and
/// GPU ranks (Gloo and NCCL), or two ranks on one GPU (NCCL needs one per rank). Empty when they
/// can.
std::string devices_conflict(const std::vector<std::string>& identities);
/// The rendezvous' one wait: every rank puts its device in the store, then waits at most
/// `timeout` for every other rank's. CourseError (the same on every rank) when a rank never
/// arrives, or when devices_conflict() finds a reason, before any group is formed.
void meet_the_others(c10d::Store& store, const RankInfo& info, const torch::Device& device,
                     std::chrono::milliseconds timeout);

/// The rendezvous' store: a TCPStore at MASTER_ADDR:MASTER_PORT, hosted by rank 0 (or by the
/// launcher); a client waits at most `timeout` for it to exist. CourseError with a HINT when the
/// address cannot be reached or the port is taken. (meet_the_others() waits for the ranks.)
c10::intrusive_ptr<c10d::Store> connect_store(const RankInfo& info,
                                              std::chrono::milliseconds timeout);
/// The communication group over `store`: NCCL for a CUDA device, Gloo for the CPU. Gloo gives up
/// on a collective after `timeout`; NCCL's watchdog after twice that, as a last resort behind
/// wait_within().
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout);
/// The backend make_group picks for `device` ("gloo" or "nccl"), or why none can serve it.
std::string backend_for(const torch::Device& device, std::string* why_not = nullptr);

/// The epoch's shuffled order of `samples` indices: the same on every rank (seed and epoch only).
torch::Tensor epoch_order(std::int64_t samples, std::uint64_t seed, int epoch);
/// Global steps in an epoch of `samples` when each step takes world_size x batch_per_rank.
std::int64_t steps_per_epoch(std::int64_t samples, int world_size, std::int64_t batch_per_rank);
/// Rank `rank`'s slice of global step `step` of `order`: its own batch_per_rank positions, never
/// another rank's (the last step may leave a rank fewer samples, or none).
torch::Tensor shard_indices(const torch::Tensor& order, std::int64_t step, int rank,
                            int world_size, std::int64_t batch_per_rank);

/// Waits until `work`, a collective on `device`'s tensors, is done: at most `timeout`, then the
/// group is aborted and std::runtime_error says so. A collective that failed (a peer's connection
/// closed) throws its own error.
void wait_within(course::CommGroup& group, c10d::Work& work, const torch::Device& device,
                 std::chrono::milliseconds timeout);
/// How many ranks answer an all-reduce: the group's first collective, which connects NCCL.
int ranks_answering(course::CommGroup& group, const torch::Device& device,
                    std::chrono::milliseconds timeout);

constexpr std::chrono::milliseconds kCollectiveTimeout{1000LL * kTimeoutSeconds};
/// Rank 0's parameters to every rank, in place (one collective on the flat tensor).
void broadcast_parameters(course::CommGroup& group, torch::Tensor& flat_values,
                          std::chrono::milliseconds timeout = kCollectiveTimeout);
/// Every rank's gradients summed, in place, on every rank (one collective on the flat tensor).
void allreduce_gradients(course::CommGroup& group, torch::Tensor& flat_gradients,
                         std::chrono::milliseconds timeout = kCollectiveTimeout);
/// A 64-bit checksum of a tensor's bytes (FNV-1a): equal checksums, bitwise-equal tensors.
std::uint64_t checksum(const torch::Tensor& tensor);
/// The smallest and largest of every rank's `value`.
std::pair<std::uint64_t, std::uint64_t> min_max_across_ranks(
    course::CommGroup& group, std::uint64_t value, const torch::Device& device,
    std::chrono::milliseconds timeout = kCollectiveTimeout);

/// One epoch's figures, the same on every rank (the loss is all-reduced).
struct EpochStats {
  double mean_loss = 0;
  double seconds = 0;
  std::int64_t samples = 0;  ///< all ranks together
};
/// What a rank's training ends with.
struct DistributedRun {
  lesson11::Trainer trainer;
  std::vector<EpochStats> epochs;
  /// For each of the first kCheckedSteps steps (ranks of a group only): the relative difference
  /// between the summed gradient and gradient_of_global_batch() from the same parameters.
  std::vector<double> gradient_diffs;
  /// The parameters after every step, as a sum of each step's checksum (int64, on the device):
  /// ranks that held identical parameters after every step hold the same trail.
  torch::Tensor trail;
};
/// One process's gradient over `indices` (a global step's samples, every rank's) from the
/// trainer's current parameters: the loss summed over them, divided by their count, as the
/// ranks' losses add up to. Leaves the trainer's gradients as they were.
torch::Tensor gradient_of_global_batch(lesson11::Trainer& trainer, const course::ImageSet& train,
                                       const torch::Tensor& indices, const torch::Device& device);
/// Trains lesson 11's MLP as rank `rank` of `world_size`: rank 0's initial parameters, this
/// rank's shard of each global step, gradients all-reduced. With no group (nullptr) it is one
/// process training with batch world_size x batch_per_rank: the reference.
DistributedRun train_data_parallel(course::CommGroup* group, int rank, int world_size,
                                   const course::ImageSet& train, int epochs,
                                   std::int64_t batch_per_rank, const torch::Device& device,
                                   std::uint64_t seed, bool print_epochs,
                                   std::chrono::milliseconds timeout = kCollectiveTimeout);

}  // namespace lesson09
