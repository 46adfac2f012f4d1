// epoch_kernel.cu: the launches of the course's training kernel (epoch_kernel.cuh). nvcc compiles
// it into machine code for Hopper GPUs (sm_90: the H100 and H200) and the A100 (sm_80), and into
// PTX, NVIDIA's portable assembly, which the driver compiles for a newer GPU when it loads it. A
// cooperative launch starts every block at once, so the grid must fit on the device: one block
// per SM here, each with the shared memory phase 1 needs (kSharedBytes, more than the 48 KB a
// kernel gets without asking).
// The kernel comes through the include path, not from beside this file: a lab's copy comes first.
#include <epoch_kernel.cuh>  // defines: train_epoch_kernel, grid_sync_kernel

namespace epoch_kernel {

//! [launch]
int grid_blocks(cudaError_t* error) {
  int device = 0, sms = 0, cooperative = 0, per_sm = 0;
  *error = cudaGetDevice(&device);
  if (*error == cudaSuccess)
    *error = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device);
  if (*error == cudaSuccess && !cooperative) *error = cudaErrorNotSupported;
  if (*error == cudaSuccess)
    *error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  for (const void* kernel : {reinterpret_cast<const void*>(train_epoch_kernel),
                             reinterpret_cast<const void*>(grid_sync_kernel)}) {
    if (*error == cudaSuccess)  // above 48 KB of dynamic shared memory, a kernel must opt in
      *error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSharedBytes));
  }
  if (*error == cudaSuccess)  // how many blocks of this kernel an SM holds at once
    *error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, train_epoch_kernel, kThreads,
                                                           kSharedBytes);
  if (*error == cudaSuccess && per_sm < 1) *error = cudaErrorCooperativeLaunchTooLarge;
  return *error == cudaSuccess ? sms : 0;
}

cudaError_t launch_train_epoch(const EpochArgs& args, cudaStream_t stream) {
  cudaError_t error = cudaSuccess;
  const int blocks = grid_blocks(&error);
  if (error != cudaSuccess) return error;
  EpochArgs copy = args;
  void* kernel_args[] = {&copy};  // a pointer to each of the kernel's parameters
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(train_epoch_kernel),
                                     dim3(blocks), dim3(kThreads), kernel_args, kSharedBytes,
                                     stream);
}
//! [launch]

cudaError_t launch_grid_syncs(int syncs, cudaStream_t stream) {
  cudaError_t error = cudaSuccess;
  const int blocks = grid_blocks(&error);
  if (error != cudaSuccess) return error;
  void* kernel_args[] = {&syncs};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(grid_sync_kernel), dim3(blocks),
                                     dim3(kThreads), kernel_args, kSharedBytes, stream);
}

}  // namespace epoch_kernel
