// cuda_emulation.h defines: what a cooperative CUDA kernel of the course's (lesson 23's
// epoch_kernel.cuh) needs to run on the CPU, so that its tests check its indexing and its
// barriers on machines without a GPU: every CUDA thread a host thread with its own threadIdx and
// blockIdx, a block's threads sharing its shared memory and __syncthreads(), a warp's 32 lanes
// exchanging values in __shfl_xor_sync(), and the whole grid meeting at grid.sync(). It runs the
// kernel's own code, not a copy of its math; it says nothing of its speed, and a race the
// barriers do not order may or may not show in a run (the host threads interleave as they will).
#pragma once

#define GPU_LESSONS_CUDA_EMULATION 1

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

// The CUDA keywords the kernel uses, for a host compiler.
#define __global__
#define __launch_bounds__(...)
// glibc's, which the kernel calls on a failed check (as CUDA's device code does).
extern "C" void __assert_fail(const char* assertion, const char* file, unsigned int line,
                              const char* function) noexcept;

namespace cuda_emulation {

/// What threadIdx, blockIdx, blockDim and gridDim hold (CUDA's uint3 and dim3, which its headers
/// define where a CUDA toolkit is: another name here).
struct Index {
  unsigned int x = 0, y = 0, z = 0;
};

/// Thrown in the threads still waiting at a barrier when another thread of the grid threw: they
/// leave the kernel too, and the launch rethrows the first error.
struct Abandoned {};

/// A barrier for `count` threads, used again and again (a generation per round), each with its own
/// lock. Every barrier of a launch shares its `abandoned` flag, so that no thread waits for one
/// that will never come: abandon() wakes every waiter, and each leaves by throwing Abandoned.
class Barrier {
 public:
  Barrier(int count, const std::atomic<bool>* abandoned) : count_(count), abandoned_(abandoned) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      woken_.notify_all();
      return;
    }
    woken_.wait(lock, [&] { return generation_ != generation || *abandoned_; });
    if (generation_ == generation) throw Abandoned{};
  }
  void abandon() {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_.notify_all();
  }

 private:
  int count_, waiting_ = 0;
  unsigned generation_ = 0;
  const std::atomic<bool>* abandoned_;
  std::mutex mutex_;
  std::condition_variable woken_;
};

struct Warp {
  explicit Warp(const std::atomic<bool>* abandoned) : barrier(32, abandoned) {}
  Barrier barrier;
  float lanes[32] = {};
};

struct Block {
  Block(unsigned threads, std::size_t shared_bytes, const std::atomic<bool>* abandoned)
      : shared((shared_bytes + sizeof(float) - 1) / sizeof(float)), barrier(threads, abandoned) {
    for (unsigned w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<Warp>(abandoned));
  }
  std::vector<float> shared;  // the dynamic shared memory
  Barrier barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

/// One launch: its grid, its blocks, and how many grid barriers it passed.
struct Launch {
  Launch(unsigned blocks, unsigned threads, std::size_t shared_bytes)
      : grid(static_cast<int>(blocks * threads), &abandoned) {
    for (unsigned b = 0; b < blocks; ++b)
      this->blocks.push_back(std::make_unique<Block>(threads, shared_bytes, &abandoned));
  }
  void abandon() {
    abandoned = true;
    grid.abandon();
    for (auto& block : blocks) {
      block->barrier.abandon();
      for (auto& warp : block->warps) warp->barrier.abandon();
    }
  }
  std::atomic<bool> abandoned{false};
  Barrier grid;
  std::vector<std::unique_ptr<Block>> blocks;
  std::int64_t grid_syncs = 0;
};

/// The launch and block the calling host thread runs for.
inline thread_local Launch* this_launch = nullptr;
inline thread_local Block* this_block = nullptr;

}  // namespace cuda_emulation

inline thread_local cuda_emulation::Index threadIdx, blockIdx;
inline cuda_emulation::Index blockDim, gridDim;

inline void __syncthreads() { cuda_emulation::this_block->barrier.wait(); }

/// Each lane gets `value` of lane (its lane ^ `lane_mask`); the whole warp takes part.
inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask) {
  if (mask != 0xffffffffu) throw std::logic_error("the emulation shuffles whole warps only");
  cuda_emulation::Warp& warp = *cuda_emulation::this_block->warps[threadIdx.x / 32];
  const unsigned lane = threadIdx.x % 32;
  warp.lanes[lane] = value;
  warp.barrier.wait();  // every lane has written
  const float theirs = warp.lanes[lane ^ static_cast<unsigned>(lane_mask)];
  warp.barrier.wait();  // every lane has read before the next shuffle writes
  return theirs;
}

inline float* block_shared_memory() { return cuda_emulation::this_block->shared.data(); }

/// CUDA's %globaltimer register: nanoseconds (here the host's steady clock).
inline std::int64_t globaltimer_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace cooperative_groups {
struct grid_group {
  void sync() {
    cuda_emulation::Launch& launch = *cuda_emulation::this_launch;
    if (blockIdx.x == 0 && threadIdx.x == 0) ++launch.grid_syncs;  // before anyone can go on
    launch.grid.wait();
  }
};
inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups

namespace cuda_emulation {

/// Runs `kernel` as cudaLaunchCooperativeKernel would with `blocks` x `threads` (a multiple of
/// 32) and `shared_bytes` of dynamic shared memory a block: every thread at once, each a host
/// thread. Returns the grid barriers it passed; rethrows the first exception a thread threw.
inline std::int64_t launch_cooperative(unsigned blocks, unsigned threads, std::size_t shared_bytes,
                                       const std::function<void()>& kernel) {
  if (threads % 32 != 0) throw std::invalid_argument("threads: whole warps only");
  Launch launch(blocks, threads, shared_bytes);
  blockDim = {threads, 1, 1}, gridDim = {blocks, 1, 1};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> host_threads;
  const auto join_all = [&] {
    for (std::thread& thread : host_threads) thread.join();
  };
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) {
      try {
        host_threads.emplace_back([&, b, t] {
          this_launch = &launch;
          this_block = launch.blocks[b].get();
          threadIdx = {t, 0, 0}, blockIdx = {b, 0, 0};
          try {
            kernel();
          } catch (const Abandoned&) {  // another thread threw first
          } catch (...) {
            {
              std::lock_guard<std::mutex> lock(error_mutex);
              if (!first_error) first_error = std::current_exception();
            }
            launch.abandon();
          }
        });
      } catch (const std::system_error&) {  // no more threads: the ones started leave, then
        launch.abandon();                   // the error goes on
        join_all();
        throw;
      }
    }
  }
  join_all();
  if (first_error) std::rethrow_exception(first_error);
  return launch.grid_syncs;
}

}  // namespace cuda_emulation
