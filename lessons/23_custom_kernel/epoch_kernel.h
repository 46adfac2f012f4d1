// epoch_kernel.h defines: what the course's training kernel (epoch_kernel.cuh) and its callers
// share: the ANN's shape, where each parameter lives in the flat tensors, the launch's shape, the
// scratch a step keeps between its phases, the kernel's arguments (EpochArgs), and, where CUDA is
// compiled in, the two launches (epoch_kernel.cu).
#pragma once

#include <cstdint>

#ifdef GPU_LESSONS_WITH_CUDA
#include <cuda_runtime_api.h>  // defines: cudaError_t, cudaStream_t
#endif

namespace epoch_kernel {

// ---- the model's shape, and where each parameter lives in the flat tensors ---------------------
constexpr int kIn = 28 * 28, kHidden1 = 128, kHidden2 = 64, kClasses = 10;
constexpr int kMaxRows = 64;  // the largest batch a step takes: the tutorial's 64
// Offsets in model.parameters()'s order: fc1.weight [128, 784], fc1.bias [128], fc2.weight
// [64, 128], fc2.bias [64], out.weight [10, 64], out.bias [10]. A weight is [outputs, inputs],
// row-major, as nn.Linear keeps it.
constexpr std::int64_t kW1 = 0, kB1 = kW1 + kHidden1 * kIn, kW2 = kB1 + kHidden1,
                       kB2 = kW2 + kHidden2 * kHidden1, kW3 = kB2 + kHidden2,
                       kB3 = kW3 + kClasses * kHidden2, kParameters = kB3 + kClasses;  // 109,386
// Adam's betas and epsilon: optim.Adam's defaults, as the tutorial leaves them.
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;

// ---- the launch ---------------------------------------------------------------------------------
//! [launch-shape]
constexpr int kThreads = 256;         // threads per block: 8 warps
constexpr int kGridSyncsPerStep = 3;  // grid-wide barriers per step (the header says which)
constexpr int kTile = 8;              // phase 1: tiles of 8 batch rows x 8 hidden units
constexpr int kSplitK = 16;           // phase 1: each tile's K = 784 split 16 ways (49 each)
constexpr int kOutputsPerThread = 4;  // phase 3: the outputs whose gradients one thread sums
// Phase 1's rows in shared memory: 784 floats and 8 more, so that the rows two apart that the two
// halves of a warp read start 16 banks apart (792 * 2 = 1584 = 16 mod 32) and never collide.
constexpr int kRowStride = kIn + 8;
// Phase 1 holds the tile's 8 images and 8 rows of W1, and where each image starts (8 int64s);
// the other phases use less.
constexpr int kSharedFloats = 2 * kTile * kRowStride + 2 * kTile;
constexpr unsigned kSharedBytes = kSharedFloats * sizeof(float);  // 50,752: over 48 KB, opted in
static_assert(kThreads == kSplitK * (kTile / 2) * (kTile / 2),
              "phase 1: a thread for each 16th of K of each 2 x 2 corner of a tile");
//! [launch-shape]

// What a step keeps between its phases, in global memory (the caller's scratch tensor): each
// phase writes its part, and the next reads it after the grid barrier.
constexpr std::int64_t kScratchH1 = 0, kScratchH2 = kScratchH1 + kMaxRows * kHidden1,
                       kScratchDOut = kScratchH2 + kMaxRows * kHidden2,
                       kScratchDH2 = kScratchDOut + kMaxRows * kClasses,
                       kScratchDH1 = kScratchDH2 + kMaxRows * kHidden2,
                       kScratchLoss = kScratchDH1 + kMaxRows * kHidden1,
                       kScratchFloats = kScratchLoss + kMaxRows;

//! [epoch-args]
/// What one launch trains on, and where it writes: device pointers, each tensor contiguous.
struct EpochArgs {
  float* parameters;           // [kParameters]: trained in place
  float* gradients;            // [kParameters]: the last step's gradients
  float* exp_avg;              // [kParameters]: Adam's first moment
  float* exp_avg_sq;           // [kParameters]: Adam's second moment
  float* step;                 // [1]: Adam's step count, read at the start and advanced at the end
  const float* images;         // [samples_in_set, 784]: the whole training set, on the device
  const std::int64_t* labels;  // [samples_in_set]
  const std::int64_t* order;   // [samples]: the epoch's order, rows of images
  std::int64_t samples_in_set;
  // Batches of `batch` from order, the last one smaller when it does not divide.
  std::int64_t samples;
  std::int64_t batch;  // 1..kMaxRows
  float lr;
  float* losses;        // [steps]: each step's mean loss
  float* scratch;       // [kScratchFloats]
  std::int64_t* clock;  // nullptr, or [kGridSyncsPerStep * steps + 1]: the phases' times
};
//! [epoch-args]

#ifdef GPU_LESSONS_WITH_CUDA
/// Launches train_epoch_kernel on `stream`, on the current device, as a cooperative kernel of
/// grid_blocks() blocks of kThreads: an error when the device cannot run it.
cudaError_t launch_train_epoch(const EpochArgs& args, cudaStream_t stream);
/// Launches grid_sync_kernel, the same grid doing nothing but `syncs` grid barriers.
cudaError_t launch_grid_syncs(int syncs, cudaStream_t stream);
/// The blocks of either launch on the current device: one per SM (0 with an error in `*error`).
int grid_blocks(cudaError_t* error);
#endif

}  // namespace epoch_kernel
