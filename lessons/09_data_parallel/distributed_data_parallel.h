// distributed_data_parallel.h defines: what lesson 09's part 2 needs of torch.distributed that
// LibTorch's C++ API has only in pieces. init_process_group: the rendezvous store (a TCPStore at
// MASTER_ADDR:MASTER_PORT), then the group of ranks (Gloo for CPU tensors, NCCL for CUDA
// tensors), each a c10d class of its own in C++. And DistributedDataParallel, which LibTorch does
// not have at all: Python's DDP(model) broadcasts rank 0's parameters once and all-reduces the
// gradients during every backward(); here those are two calls, broadcast_parameters after the
// model is made and allreduce_gradients between backward() and the optimizer's step.
#pragma once

#include <ATen/core/Tensor.h>        // defines: at::Tensor
#include <c10/core/Device.h>         // defines: c10::Device
#include <c10/util/intrusive_ptr.h>  // defines: c10::intrusive_ptr (c10d's shared pointer)

#include <chrono>
#include <vector>

#include "distributed/c10d.h"    // defines: CommGroup (c10d's group: Gloo or NCCL), c10d::Store
#include "distributed/launch.h"  // defines: RankInfo (torchrun's variables)

namespace lesson09 {

/// dist.init_process_group(backend, init_method="env://", timeout): connect_store, then
/// make_group on it. Throws what c10d throws when a rank does not come within `timeout`.
c10::intrusive_ptr<course::CommGroup> init_process_group(const course::RankInfo& info,
                                                         const c10::Device& device,
                                                         std::chrono::milliseconds timeout);

/// The rendezvous: a TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 hosts it, or torchrun's agent),
/// this attempt's keys under a prefix.
c10::intrusive_ptr<c10d::Store> connect_store(const course::RankInfo& info,
                                              std::chrono::milliseconds timeout);

/// The group of `world_size` ranks over `store`: NCCL for a CUDA device, Gloo for the CPU.
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const c10::Device& device,
                                                 std::chrono::milliseconds timeout);

/// DDP(model)'s start: rank 0's values of `parameters` copied into every rank's.
void broadcast_parameters(course::CommGroup& group, const std::vector<at::Tensor>& parameters,
                          std::chrono::milliseconds timeout);

/// Every rank's `tensor` summed, in place, on every rank.
void allreduce_sum(course::CommGroup& group, at::Tensor& tensor, std::chrono::milliseconds timeout);

/// DDP's work after backward(): the gradients of `parameters` summed over the ranks, in one bucket.
void allreduce_gradients(course::CommGroup& group, const std::vector<at::Tensor>& parameters,
                         std::chrono::milliseconds timeout);

}  // namespace lesson09
