// moving_tensors.h: what lesson 03 teaches, callable from its tests. See moving_tensors.cpp.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace lesson03 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 3;
constexpr std::int64_t kSmall = 1000;            // elements in the tensors the checks move
constexpr std::int64_t kCopyBytes = 64 << 20;    // 64 MiB: large enough to measure bandwidth
constexpr std::int64_t kCopyBytesQuick = 8 << 20;
constexpr int kTimedRuns = 5;                    // median of this many, after one warm-up
constexpr std::int64_t kLoopElements = 10000;    // the sum of squares computed three ways
constexpr std::int64_t kLoopElementsQuick = 2000;

/// What .to() gave back.
struct MoveFacts {
  bool same_tensor = false;   ///< the very same tensor object came back: no copy at all
  bool new_storage = false;   ///< the result's numbers live in different memory
  bool equal_values = false;  ///< the result holds the same numbers
};

/// `t.to(device)` for a tensor already on `device`.
MoveFacts to_same_device(const torch::Device& device);
/// `t.to(device, /*non_blocking=*/false, /*copy=*/true)`: a copy even when already there.
MoveFacts forced_copy(const torch::Device& device);
/// A CPU tensor `.to(device)`; on a CUDA device this is a host-to-device copy.
MoveFacts cpu_to(const torch::Device& device);

/// Same seed, same call, on the CPU and on `device`: are the random numbers identical?
bool same_seed_same_numbers(const torch::Device& device, std::uint64_t seed);
/// Random numbers made on the CPU and moved: identical on both sides by construction.
bool create_on_cpu_then_move_matches(const torch::Device& device, std::uint64_t seed);

/// A pinned host tensor copied with non_blocking=true arrives intact (CUDA only).
bool pinned_non_blocking_copy_matches(const torch::Device& device);

/// Host-to-device copy bandwidth in GB/s, from pageable or pinned host memory (CUDA only).
double copy_bandwidth(const torch::Device& device, std::int64_t bytes, bool pinned);

// ---- one computation, three ways ------------------------------------------------------------
/// The sum of x[i]² over a 1-D float tensor, with a C++ loop that reads each element with
/// `.item()`: one small copy to the host (and, on a GPU, one wait for it) per element.
double sum_of_squares_item_loop(const torch::Tensor& x);
/// The same with one copy to the host and a loop over a CPU accessor (plain C++ array reads).
double sum_of_squares_accessor_loop(const torch::Tensor& x);
/// The same in one tensor op, on x's own device; one `.item()` brings the result back.
double sum_of_squares_vectorized(const torch::Tensor& x);

}  // namespace lesson03
