// distributed_data_parallel.cpp: lesson 09's torch.distributed pieces
// (distributed_data_parallel.h): the store and the group of init_process_group, and DDP's broadcast
// and all-reduce.
#include "distributed_data_parallel.h"

#include <torch/torch.h>  // defines: torch::Device, torch::NoGradGuard, torch::cat

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>  // defines: c10d::PrefixStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>     // defines: c10d::TCPStore (the rendezvous)
#ifdef GPU_LESSONS_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // defines: c10d::ProcessGroupGloo
#endif
#ifdef GPU_LESSONS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // defines: c10d::ProcessGroupNCCL
#endif

#include <cstdint>
#include <string>

#include "common/verdict.h"  // defines: CourseError

namespace lesson09 {

//! [init-process-group]
// dist.init_process_group(backend, init_method="env://", timeout=...): the store, then the group.
c10::intrusive_ptr<course::CommGroup> init_process_group(const course::RankInfo& info,
                                                         const torch::Device& device,
                                                         std::chrono::milliseconds timeout) {
  return make_group(connect_store(info, timeout), info.rank, info.world_size, device, timeout);
}
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
  auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
  return c10::make_intrusive<c10d::PrefixStore>("attempt_" + std::to_string(info.restart_count),
                                                store);
}
// The group of `world_size` ranks over `store`: NCCL for CUDA tensors, Gloo for CPU tensors. It
// waits at most `timeout` for a rank: Gloo then fails the collective, NCCL's watchdog the process.
c10::intrusive_ptr<course::CommGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const torch::Device& device,
                                                 std::chrono::milliseconds timeout) {
#ifdef GPU_LESSONS_WITH_NCCL
  if (device.is_cuda()) {  // collectives on the GPU, over NVLink or the network
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  }
#endif
#ifdef GPU_LESSONS_WITH_GLOO
  if (device.is_cpu()) {  // collectives on CPU tensors over TCP; it connects to every rank now
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
  }
#endif
  throw course::CourseError("this build has no c10d backend for " + device.str(),  // exit 2
                            "Gloo needs libgloo-dev at build time, NCCL a CUDA LibTorch");
}
//! [init-process-group]

//! [broadcast-and-allreduce]
// DistributedDataParallel(model) starts every rank from rank 0's parameters: a broadcast.
void broadcast_parameters(course::CommGroup& group, const std::vector<torch::Tensor>& parameters,
                          std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;  // the backend writes into the parameters themselves
  for (const auto& p : parameters) {
    std::vector<torch::Tensor> tensors{p};
    group.broadcast(tensors)->wait(timeout);  // from rank 0; Gloo gives up after `timeout`
  }
}
// Every rank's `tensor` summed, in place, on every rank.
void allreduce_sum(course::CommGroup& group, torch::Tensor& tensor,
                   std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> tensors{tensor};
  group.allreduce(tensors)->wait(timeout);  // ReduceOp::SUM by default
}
// What DDP does after backward(): the gradients into a flat bucket (DDP's have a set size; this
// model's gradients fit one), one all-reduce, and each gradient copied back from the sum.
void allreduce_gradients(course::CommGroup& group, const std::vector<torch::Tensor>& params,
                         std::chrono::milliseconds timeout) {
  std::vector<torch::Tensor> grads;
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
//! [broadcast-and-allreduce]

}  // namespace lesson09
