// memory.h defines: one memory report for CPU and CUDA (current/peak allocated and reserved bytes,
// allocation count), the counting CPU allocator behind the CPU numbers, and an optional CPU
// memory budget that makes allocations past it throw c10::OutOfMemoryError like a full GPU.
// (What a training run's state weighs, and the driver's free memory, are lesson 07's.)
#pragma once

#include <c10/core/Device.h>  // defines: c10::Device

#include <cstdint>
#include <string>

namespace course {

/// Memory of one device. On CUDA these are the caching allocator's statistics; on the CPU those
/// of the counting allocator, which sees tensor storage only (not BLAS scratch or the heap).
struct MemoryStats {
  std::int64_t allocated = 0;       ///< bytes held by live tensors
  std::int64_t peak_allocated = 0;  ///< highest `allocated` since the last reset_peak_memory()
  std::int64_t reserved = 0;        ///< bytes the allocator holds (CUDA: allocated + cache)
  std::int64_t peak_reserved = 0;
  std::int64_t allocations = 0;  ///< allocation calls since the last reset_peak_memory()
};

/// The statistics of `device` (CPU: what the counting allocator saw since it was installed; CUDA:
/// initialises CUDA first if nothing has yet, so a baseline can be read before any tensor).
MemoryStats memory_stats(const c10::Device& device);

/// Starts a new peak (and allocation count) from the current usage.
void reset_peak_memory(const c10::Device& device);

/// Replaces LibTorch's CPU allocator with one that counts bytes (idempotent). The CPU forms of the
/// functions here call it, so the count starts at the first reading; a lesson that reports whole
/// totals (lesson 07) calls it after its device line. Storage allocated before it is never counted.
void install_counting_cpu_allocator();

/// With a budget > 0, a CPU allocation that would take the counted total past it throws
/// c10::OutOfMemoryError. 0 removes the budget.
void set_cpu_memory_budget(std::int64_t bytes);

/// "allocated 1.2 MiB (peak 3.4 MiB), reserved ... , N allocations".
std::string describe(const MemoryStats& stats);

}  // namespace course
