// c10d.h defines: course::CommGroup, the c10d class that a communication backend (Gloo, NCCL)
// derives from in this LibTorch, so that lessons name one type on 1.13 and on 2.x.
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
