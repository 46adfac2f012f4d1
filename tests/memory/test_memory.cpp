// Tests of memory/memory.h: memory metering: CPU storage, a CPU budget, the CUDA caching allocator.

#include <gtest/gtest.h>
#include <torch/torch.h>

#ifdef GPU_LESSONS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>  // defines: emptyCache
#endif

#include "cuda_test.h"
#include "memory/memory.h"
// Tests that the counting allocator sees a tensor's bytes come and go, and its peak.
TEST(CpuMemory, CountsTensorStorage) {
  course::install_counting_cpu_allocator();
  const c10::Device cpu(c10::kCPU);
  course::reset_peak_memory(cpu);
  const auto before = course::memory_stats(cpu);
  constexpr std::int64_t kBytes = 4 << 20;
  {
    const torch::Tensor t = torch::empty({kBytes / 4});
    const auto during = course::memory_stats(cpu);
    EXPECT_EQ(during.allocated - before.allocated, kBytes);
    EXPECT_GE(during.allocations, 1);
  }
  const auto after = course::memory_stats(cpu);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated - before.allocated, kBytes);
}

// Tests that a CPU budget turns an oversized allocation into c10::OutOfMemoryError.
TEST(CpuMemory, BudgetThrowsOutOfMemory) {
  course::install_counting_cpu_allocator();
  const auto in_use = course::memory_stats(c10::Device(c10::kCPU)).allocated;
  course::set_cpu_memory_budget(in_use + (1 << 20));
  EXPECT_NO_THROW(torch::empty({1000}));
  EXPECT_THROW(torch::empty({1 << 20}), c10::OutOfMemoryError);
  course::set_cpu_memory_budget(0);
  EXPECT_NO_THROW(torch::empty({1 << 20}));
}

// Tests that the CUDA caching allocator's numbers follow a tensor (GPU only).
TEST_F(CudaTest, CachingAllocatorStats) {
#ifdef GPU_LESSONS_WITH_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
  course::reset_peak_memory(device);
  const auto before = course::memory_stats(device);
  constexpr std::int64_t kBytes = 64 << 20;
  {
    const torch::Tensor t = torch::empty({kBytes / 4}, torch::TensorOptions().device(device));
    EXPECT_GE(course::memory_stats(device).allocated - before.allocated, kBytes);
  }
  const auto freed = course::memory_stats(device);
  EXPECT_EQ(freed.allocated, before.allocated);
  EXPECT_GE(freed.reserved, before.reserved + kBytes);  // the cache keeps the block
  c10::cuda::CUDACachingAllocator::emptyCache();
  EXPECT_LT(course::memory_stats(device).reserved, freed.reserved);
#endif
}
