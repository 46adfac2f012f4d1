// memory.cpp: memory statistics. The CUDA caching allocator's API is used only in CUDA builds.
#include "memory/memory.h"

#include <c10/core/CPUAllocator.h>  // defines: c10::SetCPUAllocator
#include <c10/util/Exception.h>     // defines: TORCH_CHECK_WITH, c10::OutOfMemoryError

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef GPU_LESSONS_WITH_CUDA
#include <ATen/Context.h>                   // defines: at::globalContext (lazy CUDA init)
#include <c10/cuda/CUDACachingAllocator.h>  // defines: getDeviceStats, resetPeakStats
#endif

#include "common/device.h"
#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace course {
namespace {

// ---------------------------------------------------------------------------------------------
// The counting CPU allocator

struct CpuCounters {
  std::atomic<std::int64_t> allocated{0};
  std::atomic<std::int64_t> peak{0};
  std::atomic<std::int64_t> allocations{0};
  std::atomic<std::int64_t> budget{0};
};

// Never destroyed: tensors may be freed by other static destructors at exit.
CpuCounters& counters() {
  static auto* instance = new CpuCounters;
  return *instance;
}

// Each allocation carries its size in a 64-byte header in front of the data (64 bytes keeps the
// alignment LibTorch's own CPU allocator gives). The data pointer is also the DataPtr's context,
// as raw_allocate() users (oneDNN's scratch buffers, for one) require.
constexpr size_t kHeader = 64;

void counted_free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  std::int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  counters().allocated.fetch_sub(bytes);
  std::free(base);
}

// LibTorch 1.13 declares allocate() const; 2.x declares it non-const and adds a pure virtual
// copy_data(). Defining both overloads and copy_data() fits either interface, and so none of them
// can say `override` in both (clang asks for it where another member has it).
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const { return counted_allocate(bytes); }
  c10::DataPtr allocate(size_t bytes) { return counted_allocate(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }

 private:
  static c10::DataPtr counted_allocate(size_t bytes) {
    const c10::Device cpu(c10::kCPU);
    if (bytes == 0) return c10::DataPtr(nullptr, nullptr, &counted_free, cpu);
    auto& c = counters();
    const auto size = static_cast<std::int64_t>(bytes);
    const std::int64_t now = c.allocated.fetch_add(size) + size;
    const std::int64_t budget = c.budget.load();
    if (budget > 0 && now > budget) {
      c.allocated.fetch_sub(size);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU memory budget exceeded: tried to allocate ",
                       format_bytes(static_cast<double>(size)), " with ",
                       format_bytes(static_cast<double>(now - size)), " in use and a budget of ",
                       format_bytes(static_cast<double>(budget)));
    }
    void* base = nullptr;
    if (posix_memalign(&base, kHeader, bytes + kHeader) != 0) {
      c.allocated.fetch_sub(size);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ",
                       format_bytes(static_cast<double>(size)));
    }
    std::memcpy(base, &size, sizeof size);
    std::int64_t peak = c.peak.load();
    while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
    }
    c.allocations.fetch_add(1);
    void* data = static_cast<char*>(base) + kHeader;
    return c10::DataPtr(data, data, &counted_free, cpu);
  }
};
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

std::atomic<bool> g_installed{false};

}  // namespace

void install_counting_cpu_allocator() {
  if (g_installed.exchange(true)) return;
  // Lives forever, as LibTorch requires of registered allocators.
  static auto* allocator = new CountingCpuAllocator();
  c10::SetCPUAllocator(allocator, /*priority=*/100);
}

void set_cpu_memory_budget(std::int64_t bytes) {
  install_counting_cpu_allocator();  // a budget on an allocator that does not count would do
                                     // nothing
  counters().budget.store(bytes);
}

// ---------------------------------------------------------------------------------------------
// Statistics

#ifdef GPU_LESSONS_WITH_CUDA
namespace {
// The caching allocator exists only once LibTorch has initialised CUDA, which it does lazily, on
// the first CUDA tensor; until then its statistics functions throw "Invalid device argument".
// Reading memory before any allocation is legitimate (a baseline), so initialise first.
void init_cuda_allocator() {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}
}  // namespace
#endif

MemoryStats memory_stats(const c10::Device& device) {
  MemoryStats stats;
  if (device.is_cpu()) {
    install_counting_cpu_allocator();
    const auto& c = counters();
    stats.allocated = stats.reserved = c.allocated.load();
    stats.peak_allocated = stats.peak_reserved = c.peak.load();
    stats.allocations = c.allocations.load();
  }
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {
    init_cuda_allocator();
    // Index 0 of each StatArray is the aggregate over small and large pools.
    const auto cuda = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    stats.allocated = cuda.allocated_bytes[0].current;
    stats.peak_allocated = cuda.allocated_bytes[0].peak;
    stats.reserved = cuda.reserved_bytes[0].current;
    stats.peak_reserved = cuda.reserved_bytes[0].peak;
    stats.allocations = cuda.allocation[0].allocated;
  }
#endif
  return stats;
}

void reset_peak_memory(const c10::Device& device) {
  if (device.is_cpu()) {
    install_counting_cpu_allocator();
    auto& c = counters();
    c.peak.store(c.allocated.load());
    c.allocations.store(0);
  }
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {
    init_cuda_allocator();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    c10::cuda::CUDACachingAllocator::resetAccumulatedStats(device.index());
  }
#endif
}

std::string describe(const MemoryStats& stats) {
  auto b = [](std::int64_t v) { return format_bytes(static_cast<double>(v)); };
  return "allocated " + b(stats.allocated) + " (peak " + b(stats.peak_allocated) + "), reserved " +
         b(stats.reserved) + " (peak " + b(stats.peak_reserved) + "), " +
         std::to_string(stats.allocations) + " allocations";
}

}  // namespace course
