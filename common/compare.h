// compare.h defines: how the course says two results are "the same": the largest absolute and
// relative differences of tensors, the tolerance each dtype earns, with the reasoning for each in
// one place (tolerance_for, below), parameters' gradients as a list to compare, and a checksum
// that tells bitwise-equal tensors apart from others (ranks of a job compare theirs).
#pragma once

#include <ATen/core/Tensor.h>     // defines: at::Tensor
#include <c10/core/ScalarType.h>  // defines: c10::ScalarType

#include <cstdint>
#include <vector>

namespace course {

/// Largest |a - b|, computed in float64 on the CPU. Infinity when either is undefined or the
/// shapes differ: a missing result is never "close".
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);
/// The largest max_abs_diff over two lists of tensors, pair by pair (infinity for lists of
/// different lengths).
double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
/// max |a - b| / max |b|: one element's error against the scale of the whole result (0 when
/// both are all zero).
double max_rel_diff(const at::Tensor& a, const at::Tensor& b);
/// The largest max_rel_diff over two lists of tensors, pair by pair (each against its own scale).
double max_rel_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
/// The gradient (.grad()) of each of `params`, in order, to compare with max_rel_diff: undefined
/// where a parameter has none, which compares as infinitely far.
std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& params);
/// ||a - b|| / ||b|| (L2 norms): how far apart two whole vectors are (0 when both are zero).
double relative_diff(const at::Tensor& a, const at::Tensor& b);

/// A 64-bit checksum of a tensor's bytes (FNV-1a), wherever the tensor lives: equal for
/// bitwise-equal tensors, and a single changed bit changes it.
std::uint64_t checksum(const at::Tensor& tensor);

/// The relative tolerance for one computation done two ways in `dtype` (another order of the
/// same sums, another device, another kernel): compare max_rel_diff or relative_diff with it.
///
/// Two ways of computing the same result differ by rounding. A sum of n terms in a format with
/// machine epsilon eps (the spacing of numbers near 1) changes by up to about n * eps of its
/// magnitude when the order of the additions changes, and typically by sqrt(n) * eps, since the
/// roundings go up as often as down. The course's sums have up to a few thousand terms (a
/// matmul's inner dimension, a batch's samples):
///   - float64, eps 2.2e-16: sqrt(4096) * eps is 1.4e-14; 1e-12 leaves room for the worst case;
///   - float32, eps 1.2e-7: sqrt(4096) * eps is 7.6e-6; 1e-5 holds for a CPU against a GPU, split
///     sums (data parallelism) and another kernel, while a wrong result (a missing term, a wrong
///     scale) is off by far more. TF32 matmuls (off by default in LibTorch) would need 1e-3;
///   - bfloat16 (eps 7.8e-3) and float16 (eps 9.8e-4): one rounding is already of that size;
///     1e-2, about bfloat16's own step, is the tightest bound that holds for both.
/// A comparison of whole trajectories (training steps, each feeding the next) grows its
/// differences step by step and needs a wider bound of its own, stated where it is made.
constexpr double kDoubleTolerance = 1e-12, kFloatTolerance = 1e-5, kHalfTolerance = 1e-2;
constexpr double tolerance_for(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Double  ? kDoubleTolerance
         : dtype == c10::ScalarType::Float ? kFloatTolerance
                                           : kHalfTolerance;
}

}  // namespace course
