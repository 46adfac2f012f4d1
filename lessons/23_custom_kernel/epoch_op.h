// epoch_op.h defines: what a program that calls the operator gpu_lessons::train_epoch needs
// beside its name: the file of the library that registers it (Python loads that file), and the
// C++ type of the call, for the dispatcher.
#pragma once

#include <ATen/core/Tensor.h>   // defines: at::Tensor
#include <c10/util/Optional.h>  // defines: c10::optional (Python's None or a value)

#include <cstdint>
#include <string>

namespace epoch_op {

/// The operator's name: the namespace TORCH_LIBRARY declared it in, then its own.
constexpr const char* kName = "gpu_lessons::train_epoch";

//! [type]
/// train_epoch's C++ type, as the dispatcher calls it (epoch_op.cpp's schema, in C++ types: a
/// function type, taking these arguments and returning a tensor).
using TrainEpoch = at::Tensor(at::Tensor& parameters, at::Tensor& gradients, at::Tensor& exp_avg,
                              at::Tensor& exp_avg_sq, at::Tensor& step, const at::Tensor& images,
                              const at::Tensor& labels, const at::Tensor& order,
                              std::int64_t batch_size, double lr,
                              const c10::optional<at::Tensor>& clock);
//! [type]

/// The path of the shared library this code is in (libgpu_lessons_ops.so): what Python's
/// torch.ops.load_library() takes.
std::string library_path();

}  // namespace epoch_op
