// job.h defines: lesson 17's job of ranks, which ends when one of them fails instead of hanging:
// lesson 09's loop (the tutorial's ANN, DistributedSampler's shards, DDP's broadcast and gradient
// all-reduce) with every collective waiting at most a deadline (on NCCL too), a rendezvous that
// waits once and says how many ranks arrived, and one rule for the device every rank takes.
// Lesson 18 checks the same job for the failures that raise no error.
#pragma once

#include <torch/torch.h>  // defines: torch::Tensor, torch::Device

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>  // defines: c10d::Store
#include <vector>

#include "common/ann.h"          // defines: ANN
#include "common/cli.h"          // defines: CommonOptions
#include "common/data.h"         // defines: ImageSet
#include "distributed/c10d.h"    // defines: CommGroup, abort_group
#include "distributed/launch.h"  // defines: RankInfo

namespace lesson17 {

// ---- the job's settings: lesson 09's epochs, batch and Adam; how long a rank waits -----------
constexpr int kEpochs = 5;
constexpr std::int64_t kBatchPerRank = 64;
constexpr double kLearningRate = 1e-3;
constexpr int kTimeoutSeconds = 120;           // a rank dead or missing: give up after this
constexpr std::int64_t kQuickSamples = 10000;  // --quick: one epoch on the first 10,000 images

/// The device a rank takes, and why the ranks train on the CPU although GPUs are visible.
struct RankDevice {
  std::string device;  ///< "cpu", "cuda:N", or the request as given when no GPU is visible
  std::string reason;  ///< why the ranks train on the CPU although GPUs are visible; else empty
};
/// One rule, which every rank of a host applies to the same facts, so that all ranks land on the
/// same kind of device. course::UsageError for --device cuda with fewer GPUs than ranks.
RankDevice rank_device(const std::string& requested, int gpus, const course::RankInfo& info,
                       const std::string& cuda_visible_devices);
/// Why ranks on these devices (identities in rank order) cannot form one group; "" when they can.
std::string devices_conflict(const std::vector<std::string>& identities);
/// A rank's options under torchrun: its device by rank_device's rule (into options.device) and its
/// share of the host's cores (options.threads, unless given). Returns rank_device's reason.
std::string take_rank_device(course::CommonOptions& options, const course::RankInfo& job);

/// Lesson 09's store, whose failures are told apart (a port taken, an address nobody serves).
c10::intrusive_ptr<c10d::Store> connect_store(const course::RankInfo& info,
                                              std::chrono::milliseconds timeout);
/// The rendezvous' one wait, at most `timeout`, for every rank's device; course::CourseError
/// saying how many arrived, or why their devices cannot form one group.
void meet_the_others(c10d::Store& store, const course::RankInfo& info, const torch::Device& device,
                     std::chrono::milliseconds timeout);
/// Lesson 09's group (NCCL on a GPU, Gloo on the CPU), NCCL's watchdog at twice `timeout`.
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout);
/// A rank joins its job, saying so: the store (connect_store), every rank met (meet_the_others),
/// the group made (make_group). Its errors are course::CourseError: the job never started.
c10::intrusive_ptr<course::CommGroup> join_job(const course::RankInfo& info,
                                               const torch::Device& device,
                                               std::chrono::milliseconds timeout);
/// The group's first all-reduce, which every rank must answer (NCCL connects only then), printed.
void connect_group(course::CommGroup& group, const course::RankInfo& info,
                   const torch::Device& device, std::chrono::milliseconds timeout);
/// Waits at most `timeout` for `work`, a collective on `device`'s tensors; then aborts the group
/// and throws std::runtime_error. A collective that failed throws its own error.
void wait_within(course::CommGroup& group, c10d::Work& work, const torch::Device& device,
                 std::chrono::milliseconds timeout);

/// DDP's start: every rank takes rank 0's parameters.
void broadcast_parameters(course::CommGroup& group, course::ANN& model,
                          std::chrono::milliseconds timeout);
/// Every rank's `tensor` summed, in place, on every rank.
void allreduce_sum(course::CommGroup& group, torch::Tensor& tensor,
                   std::chrono::milliseconds timeout);
/// DDP's after backward(): the gradients summed over the ranks, in one bucket.
void allreduce_gradients(course::CommGroup& group, course::ANN& model,
                         std::chrono::milliseconds timeout);

/// Called at each step once the gradients are summed, before Adam, with the step's samples (every
/// rank's): lesson 18's checks.
using StepCheck = std::function<void(course::ANN& model, const torch::Tensor& global)>;
/// Lesson 05's loop as rank `rank` of `world_size` (lesson 09's part 2); each epoch's mean loss
/// into `losses` (unless null), `check` at each step (unless empty).
course::ANN train_data_parallel(course::CommGroup& group, int rank, int world_size,
                                const course::ImageSet& train, int epochs,
                                std::int64_t batch_per_rank, const torch::Device& device,
                                std::uint64_t seed, std::chrono::milliseconds timeout,
                                std::vector<double>* losses = nullptr,
                                const StepCheck& check = nullptr);

}  // namespace lesson17
