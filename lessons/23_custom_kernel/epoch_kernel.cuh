// epoch_kernel.cuh defines: the tutorial's training as one CUDA kernel of the course's own,
// train_epoch_kernel: for every batch of an epoch, the ANN's forward pass (784-128-64-10, ReLU),
// the cross-entropy loss and its gradient, the backward pass and Adam, all in fp32, with the
// parameters, their gradients and Adam's state in one flat tensor each (the order of
// model.parameters()). It is launched once per epoch as a cooperative kernel: every block stays
// resident on its SM for the whole epoch, and the blocks wait for each other at grid-wide barriers
// (grid.sync()) where a step's next phase needs what the others wrote, instead of ending the
// kernel and launching the next one.
//
// Who computes what, in each step (a block is kThreads = 256 threads, 8 warps of 32):
//   phase 1, the first layer: h1 = relu(x W1^T + b1), [rows, 128] from K = 784 products each.
//            Output tiles of 8 rows x 8 hidden units, one tile per block at a time: the block
//            copies the tile's 8 images and 8 rows of W1 into shared memory, then each thread
//            sums a 2 x 2 corner of the tile over a 16th of K, and 16 neighbouring lanes add
//            their sums with warp shuffles.
//   phase 2, one batch row per block: h2 = relu(h1 W2^T + b2) (a warp per unit, its 32 lanes
//            splitting the 128 products), the 10 logits, the loss and its gradient d_out =
//            (softmax - one_hot(label)) / rows (one thread), then the gradients flowing back,
//            d_h2 = (d_out W3) * (h2 > 0) and d_h1 = (d_h2 W2) * (h1 > 0), a thread per unit.
//   phase 3, the parameters: every weight's gradient is a sum over the batch rows, dW = d^T a
//            (d: the gradient at the layer's output, a: its input) and db = d's rows summed. A
//            thread takes 4 outputs of one column (one input pixel or unit): it reads that column
//            of a once per row for 4 products, then takes Adam's step on those 4 parameters right
//            away, since no later phase of this step reads them. Thread 0 writes the step's loss.
// Three grid barriers a step: after phase 1 (phase 2 reads every block's h1), after phase 2
// (phase 3 reads every row's gradients) and after phase 3 (the next step reads the new weights).
//
// The tests run this very code on the CPU (tests/cuda_emulation.h: each CUDA thread a host
// thread, the same barriers), so its indexing is checked on machines without a GPU.
#pragma once

#include <cstdint>

#include "epoch_kernel.h"  // defines: the shapes, offsets and EpochArgs the kernel uses

#ifdef __CUDACC__
#include <cooperative_groups.h>  // defines: cooperative_groups::this_grid, grid_group::sync
#elif !defined(GPU_LESSONS_CUDA_EMULATION)
#error "epoch_kernel.cuh is CUDA: compile it with nvcc, or include cuda_emulation.h first"
#endif

namespace epoch_kernel {

// ---- helpers ------------------------------------------------------------------------------------
#ifdef __CUDACC__
#define EPOCH_DEVICE __device__ __forceinline__
// The block's dynamic shared memory (kSharedBytes, set at the launch).
EPOCH_DEVICE float* block_shared_memory() {
  extern __shared__ float shared[];
  return shared;
}
// The GPU's clock, in nanoseconds (the same on every SM).
EPOCH_DEVICE std::int64_t globaltimer_ns() {
  std::int64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}
#else
#define EPOCH_DEVICE inline  // the emulation's host code (cuda_emulation.h)
#endif

// A bad index stops the kernel as PyTorch's own kernels do ("device-side assert triggered"),
// in a Release build too: an index past the images would read memory that is not the data.
#define EPOCH_CHECK(condition)                                                 \
  do {                                                                         \
    if (!(condition)) __assert_fail(#condition, __FILE__, __LINE__, __func__); \
  } while (false)

// Block 0's clock (CUDA's %globaltimer, in nanoseconds) into `args.clock[slot]`, when the caller
// asked for the phases' times: slot 0 as the kernel starts, then one after each grid barrier.
EPOCH_DEVICE void record_clock(const EpochArgs& args, std::int64_t slot) {
  if (args.clock != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    args.clock[slot] = globaltimer_ns();
}

// One step's batch: `rows` samples starting at order[first].
struct Step {
  std::int64_t index, first;
  int rows;
};

EPOCH_DEVICE std::int64_t sample_of(const EpochArgs& args, const Step& s, int row) {
  const std::int64_t sample = args.order[s.first + row];
  EPOCH_CHECK(sample >= 0 && sample < args.samples_in_set);
  return sample;
}

//! [lanes]
// The sum of `value` over the 2 * `width` lanes of a warp that differ only in their low bits
// (width 16: 32 lanes; 8: groups of 16), every lane of the group getting it: each round adds
// the value of the lane `width`, then width / 2, ... lanes away (butterfly shuffles).
EPOCH_DEVICE float sum_across_lanes(float value, int width) {
  for (int lanes = width; lanes > 0; lanes /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, lanes);
  return value;
}
//! [lanes]

// ---- phase 1: the first layer -------------------------------------------------------------------
//! [phase-1]
EPOCH_DEVICE void first_layer(const EpochArgs& args, const Step& s, float* shared) {
  float* x = shared;                       // [kTile][kRowStride]: the tile's 8 images
  float* w = shared + kTile * kRowStride;  // [kTile][kRowStride]: its 8 rows of W1
  std::int64_t* image = reinterpret_cast<std::int64_t*>(w + kTile * kRowStride);  // [kTile]
  float* h1 = args.scratch + kScratchH1;                                          // [rows, 128]
  const int unit_tiles = kHidden1 / kTile;                                        // 16
  const int tiles = (s.rows + kTile - 1) / kTile * unit_tiles;
  // This thread's part of a tile: rows i, i + 1 and units j, j + 1 of the tile, summed over
  // k = part, part + 16, ... (16 neighbouring lanes: the same corner, each its 16th of K).
  const int part = threadIdx.x % kSplitK, corner = threadIdx.x / kSplitK;  // 0..15, 0..15
  const int i = 2 * (corner / 4), j = 2 * (corner % 4);
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int row0 = tile / unit_tiles * kTile, unit0 = tile % unit_tiles * kTile;
    if (threadIdx.x < kTile) {  // where each of the tile's images starts (-1: past the batch)
      const int row = row0 + threadIdx.x;
      image[threadIdx.x] = row < s.rows ? sample_of(args, s, row) * kIn : -1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kIn; e += kThreads) {  // neighbouring threads: along k
      const int r = e / kIn, k = e % kIn;
      x[r * kRowStride + k] = image[r] >= 0 ? args.images[image[r] + k] : 0;
      w[r * kRowStride + k] = args.parameters[kW1 + (unit0 + r) * kIn + k];
    }
    __syncthreads();                                   // the tile is in shared memory
    float sum00 = 0, sum01 = 0, sum10 = 0, sum11 = 0;  // rows i, i+1 x units j, j+1
    for (int k = part; k < kIn; k += kSplitK) {
      const float x0 = x[i * kRowStride + k], x1 = x[(i + 1) * kRowStride + k];
      const float w0 = w[j * kRowStride + k], w1 = w[(j + 1) * kRowStride + k];
      sum00 += x0 * w0, sum01 += x0 * w1, sum10 += x1 * w0, sum11 += x1 * w1;
    }
    sum00 = sum_across_lanes(sum00, kSplitK / 2), sum01 = sum_across_lanes(sum01, kSplitK / 2);
    sum10 = sum_across_lanes(sum10, kSplitK / 2), sum11 = sum_across_lanes(sum11, kSplitK / 2);
    if (part == 0) {
      const float* b1 = args.parameters + kB1;
      const int u = unit0 + j;
      const float sums[2][2] = {{sum00, sum01}, {sum10, sum11}};
      for (int di = 0; di < 2; ++di) {
        const int row = row0 + i + di;
        if (row >= s.rows) continue;
        for (int dj = 0; dj < 2; ++dj)
          h1[row * kHidden1 + u + dj] = fmaxf(sums[di][dj] + b1[u + dj], 0.0f);  // ReLU
      }
    }
    __syncthreads();  // every thread is done with the tile before the next one is copied in
  }
}
//! [phase-1]

// ---- phase 2: each row's second and third layers, its loss, and the gradients flowing back -----
//! [phase-2]
EPOCH_DEVICE void row_phase(const EpochArgs& args, const Step& s, float* shared) {
  float* h1 = shared;             // [128]: this row's h1
  float* h2 = h1 + kHidden1;      // [64]
  float* logits = h2 + kHidden2;  // [10]
  float* d_out = logits + 16;     // [10]
  float* d_h2 = d_out + 16;       // [64]
  float* scratch = args.scratch;
  const float *W2 = args.parameters + kW2, *b2 = args.parameters + kB2;
  const float *W3 = args.parameters + kW3, *b3 = args.parameters + kB3;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, warps = kThreads / 32;
  for (int r = blockIdx.x; r < s.rows; r += gridDim.x) {
    if (t < kHidden1) h1[t] = scratch[kScratchH1 + r * kHidden1 + t];
    __syncthreads();
    // h2 = relu(h1 W2^T + b2): warp w computes units w, w + 8, ...; lane l multiplies
    // k = l, l + 32, l + 64, l + 96 (W2's row read 32 neighbouring floats at a time).
    for (int u = warp; u < kHidden2; u += warps) {
      float sum = 0;
      for (int k = lane; k < kHidden1; k += 32) sum += W2[u * kHidden1 + k] * h1[k];
      sum = sum_across_lanes(sum, 16);
      if (lane == 0) {
        h2[u] = fmaxf(sum + b2[u], 0.0f);
        scratch[kScratchH2 + r * kHidden2 + u] = h2[u];  // phase 3 reads it for dW3
      }
    }
    __syncthreads();
    for (int c = warp; c < kClasses; c += warps) {  // logits = h2 W3^T + b3, the same way
      float sum = 0;
      for (int k = lane; k < kHidden2; k += 32) sum += W3[c * kHidden2 + k] * h2[k];
      sum = sum_across_lanes(sum, 16);
      if (lane == 0) logits[c] = sum + b3[c];
    }
    __syncthreads();
    if (t == 0) {  // cross_entropy: log(sum(exp(logits))) - logits[label], and its gradient
      const std::int64_t label = args.labels[sample_of(args, s, r)];
      EPOCH_CHECK(label >= 0 && label < kClasses);
      float top = logits[0];
      for (int c = 1; c < kClasses; ++c) top = fmaxf(top, logits[c]);
      float total = 0;
      for (int c = 0; c < kClasses; ++c) total += expf(logits[c] - top);
      const float log_total = top + logf(total);
      scratch[kScratchLoss + r] = log_total - logits[label];
      for (int c = 0; c < kClasses; ++c) {  // (softmax - one_hot) / rows: the mean's gradient
        d_out[c] = (expf(logits[c] - log_total) - (c == label ? 1.0f : 0.0f)) / s.rows;
        scratch[kScratchDOut + r * kClasses + c] = d_out[c];
      }
    }
    __syncthreads();
    if (t < kHidden2) {  // d_h2 = (d_out W3) * (h2 > 0): thread t for unit t
      float sum = 0;
      for (int c = 0; c < kClasses; ++c) sum += d_out[c] * W3[c * kHidden2 + t];
      d_h2[t] = h2[t] > 0 ? sum : 0.0f;
      scratch[kScratchDH2 + r * kHidden2 + t] = d_h2[t];
    }
    __syncthreads();
    if (t < kHidden1) {  // d_h1 = (d_h2 W2) * (h1 > 0): thread t for unit t, W2 read by columns
      // >>> lab: d_h1 for unit t: the sum over k of d_h2[k] * W2[k][t], 0 where h1[t] <= 0
      float sum = 0;
      for (int k = 0; k < kHidden2; ++k) sum += d_h2[k] * W2[k * kHidden1 + t];
      scratch[kScratchDH1 + r * kHidden1 + t] = h1[t] > 0 ? sum : 0.0f;
      // <<< lab
    }
    __syncthreads();  // the row is done before the next one's values are loaded
  }
}
//! [phase-2]

// ---- phase 3: the gradients, and Adam -----------------------------------------------------------
//! [phase-3]
// One layer's parameters for phase 3: y = a W^T + b, with d = dL/dy.
struct Layer {
  const float* d;  // [rows, outputs]
  int outputs;
  const float* input;  // [rows, inputs]; nullptr: the images, row r = image sample_of(r)
  int inputs;
  std::int64_t weight, bias;  // offsets in the flat tensors
};

// Adam's step on parameter p with gradient g (torch.optim.Adam's formula, its defaults).
struct Adam {
  float lr, step_size, bias_correction2_sqrt;
};

EPOCH_DEVICE Adam adam_for(float lr, float step) {  // step: 1 for the first
  const double bias_correction1 = 1 - pow(kBeta1, static_cast<double>(step));
  const double bias_correction2 = 1 - pow(kBeta2, static_cast<double>(step));
  return {lr, static_cast<float>(lr / bias_correction1),
          static_cast<float>(sqrt(bias_correction2))};
}

EPOCH_DEVICE void adam_update(const EpochArgs& args, std::int64_t p, float g, const Adam& adam) {
  const float m = static_cast<float>(kBeta1) * args.exp_avg[p] + static_cast<float>(1 - kBeta1) * g;
  const float v =
      static_cast<float>(kBeta2) * args.exp_avg_sq[p] + static_cast<float>(1 - kBeta2) * g * g;
  args.exp_avg[p] = m, args.exp_avg_sq[p] = v;
  args.gradients[p] = g;
  const float denominator = sqrtf(v) / adam.bias_correction2_sqrt + static_cast<float>(kEpsilon);
  args.parameters[p] -= adam.step_size * (m / denominator);
}

// kOutputsPerThread outputs of `layer` from `first`, column `column` (an input; `layer.inputs`:
// the bias).
EPOCH_DEVICE void gradients_of_column(const EpochArgs& args, const Layer& layer, int first,
                                      int column, const std::int64_t* image_rows, int rows,
                                      const Adam& adam) {
  const int count =
      layer.outputs - first < kOutputsPerThread ? layer.outputs - first : kOutputsPerThread;
  const bool bias = column == layer.inputs;
  float sum[kOutputsPerThread] = {};
  // >>> lab: sum[o] = the sum over the rows r of d[r][first + o] * a[r][column] (1 for the bias)
  for (int r = 0; r < rows; ++r) {
    const float input = bias          ? 1.0f
                        : layer.input ? layer.input[r * layer.inputs + column]
                                      : args.images[image_rows[r] + column];
    const float* d = layer.d + r * layer.outputs + first;
    for (int o = 0; o < kOutputsPerThread; ++o)
      if (o < count) sum[o] += d[o] * input;
  }
  // <<< lab
  for (int o = 0; o < count; ++o) {
    const std::int64_t p =
        bias ? layer.bias + first + o
             : layer.weight + static_cast<std::int64_t>(first + o) * layer.inputs + column;
    adam_update(args, p, sum[o], adam);
  }
}

EPOCH_DEVICE void parameter_phase(const EpochArgs& args, const Step& s, float* shared,
                                  float adam_step) {
  std::int64_t* image_rows = reinterpret_cast<std::int64_t*>(shared);  // [rows]: image offsets
  for (int r = threadIdx.x; r < s.rows; r += kThreads) image_rows[r] = sample_of(args, s, r) * kIn;
  __syncthreads();
  const float* scratch = args.scratch;
  const Layer layers[3] = {
      {scratch + kScratchDH1, kHidden1, nullptr, kIn, kW1, kB1},
      {scratch + kScratchDH2, kHidden2, scratch + kScratchH1, kHidden1, kW2, kB2},
      {scratch + kScratchDOut, kClasses, scratch + kScratchH2, kHidden2, kW3, kB3}};
  const Adam adam = adam_for(args.lr, adam_step);
  // The work items, layer after layer: for each group of 4 outputs, its columns (inputs, then
  // the bias); neighbouring threads take neighbouring columns, so reads of a and of the
  // parameters are 32 neighbouring floats a warp. One numbering runs through the three layers:
  // `item` is this thread's next number, kept from one layer to the next (so the loop has no
  // first clause), and layer_first the number where the layer starts.
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * kThreads;
  std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  std::int64_t layer_first = 0;
  for (const Layer& layer : layers) {
    const int groups = (layer.outputs + kOutputsPerThread - 1) / kOutputsPerThread;
    const std::int64_t items = static_cast<std::int64_t>(groups) * (layer.inputs + 1);
    for (; item < layer_first + items; item += threads) {
      const std::int64_t local = item - layer_first;
      const int group = static_cast<int>(local / (layer.inputs + 1));
      const int column = static_cast<int>(local % (layer.inputs + 1));
      gradients_of_column(args, layer, group * kOutputsPerThread, column, image_rows, s.rows, adam);
    }
    layer_first += items;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // the step's loss: the mean of its rows'
    float total = 0;
    for (int r = 0; r < s.rows; ++r) total += scratch[kScratchLoss + r];
    args.losses[s.index] = total / s.rows;
  }
}
//! [phase-3]

// ---- the kernel: the whole epoch ----------------------------------------------------------------
//! [kernel]
__global__ void __launch_bounds__(kThreads) train_epoch_kernel(EpochArgs args) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  float* shared = block_shared_memory();
  const float first_step =
      *args.step;  // Adam's steps before this epoch (every thread reads it
                   // before the first barrier; thread 0 writes it after the last)
  const std::int64_t steps = (args.samples + args.batch - 1) / args.batch;
  record_clock(args, 0);
  for (std::int64_t k = 0; k < steps; ++k) {
    const std::int64_t first = k * args.batch;
    const Step s{
        k, first,
        static_cast<int>(args.samples - first < args.batch ? args.samples - first : args.batch)};
    first_layer(args, s, shared);
    grid.sync();  // phase 2 reads every tile's h1
    record_clock(args, 1 + kGridSyncsPerStep * k);
    row_phase(args, s, shared);
    grid.sync();  // phase 3 reads every row's gradients
    record_clock(args, 2 + kGridSyncsPerStep * k);
    parameter_phase(args, s, shared, first_step + static_cast<float>(k + 1));
    grid.sync();  // the next step reads the new parameters, and overwrites the scratch
    record_clock(args, 3 + kGridSyncsPerStep * k);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *args.step = first_step + static_cast<float>(steps);
}

// A kernel that does nothing but `syncs` grid barriers: what one costs (the lesson's floor).
__global__ void __launch_bounds__(kThreads) grid_sync_kernel(int syncs) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (int i = 0; i < syncs; ++i) grid.sync();
}
//! [kernel]

}  // namespace epoch_kernel
