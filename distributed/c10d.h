// c10d.h defines: course::CommGroup, the c10d class that a communication backend (Gloo, NCCL)
// derives from in this LibTorch, so that lessons name one type on 1.13 and on 2.x; and
// abort_group() and shutdown_group(), which 1.13's groups do not have.
#pragma once

#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

#if GPU_LESSONS_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>  // defines: c10d::Backend
namespace course {
/// 2.x: a ProcessGroup dispatches to one Backend per device type; Gloo and NCCL are Backends.
using CommGroup = c10d::Backend;
}  // namespace course
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>  // defines: c10d::ProcessGroup
namespace course {
/// 1.13: Gloo and NCCL derive from ProcessGroup itself.
using CommGroup = c10d::ProcessGroup;
}  // namespace course
#endif

namespace course {

/// Stops a group's communication where it stands (NCCL: its communicators are aborted, and
/// kernels waiting for a peer return), so that nothing is left waiting for a rank that died.
/// LibTorch 1.13's groups have no abort: there the process's exit ends them.
inline void abort_group(CommGroup& group) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 11)
  group.abort();
#else
  (void)group;
#endif
}

/// Ends a group in order once its last collective is done (NCCL: waits for pending work, then
/// frees its communicators; without it 2.x warns that the group was not destroyed).
inline void shutdown_group(CommGroup& group) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 11)
  group.shutdown();
#else
  (void)group;
#endif
}

}  // namespace course
