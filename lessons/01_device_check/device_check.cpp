// Lesson 01 — device check: what does this machine offer, and where will the course run?
//
// You will learn:
//   - the tutorials' device choice, line for line: torch::cuda::is_available() picks "cuda" or
//     "cpu", the program says which (and names the GPU), and a first tensor goes there;
//   - how to ask LibTorch which version it is and whether it was built with CUDA;
//   - how many GPUs it sees, and each GPU's name, compute capability and memory;
//   - how the course turns --device auto|cpu|cuda|cuda:N into a torch::Device (auto is the
//     tutorials' choice), falling back to the CPU (with the reason printed) when no GPU is usable;
//   - that work on the chosen device gives the same numbers as on the CPU.
//
// Run:    build/bin/lesson01_device_check [--device auto|cpu|cuda|cuda:N]
// Checks: the tutorials' device is the one --device auto picks and their tensor lands there; a
//         matmul on the chosen device matches the CPU within kProbeTolerance (relative); the GPU
//         count agrees with the GPUs listed. Exit 0 PASS, 1 FAIL, 2 bad flag (an unknown device,
//         or a GPU index past the count).
#include <torch/torch.h>    // defines: torch::cuda, torch::Device, torch::mm, torch::randn
#include <torch/version.h>  // defines: TORCH_VERSION

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

// GPU_LESSONS_WITH_CUDA: CMake defines it when this LibTorch has CUDA.
#ifdef GPU_LESSONS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>  // defines: at::cuda::getDeviceProperties
#endif

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/compare.h"  // defines: max_rel_diff, tolerance_for
#include "common/device.h"   // defines: resolve_device, DeviceChoice, list_gpus, why_no_cuda, ...
#include "common/verdict.h"  // defines: Verdict, report_error
#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace lesson01 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 1;        // the probe's inputs derive from it
constexpr std::int64_t kProbeSize = 512;  // side of the square matmul run on the chosen device
// An fp32 matmul on two devices: the same sums in another order (common/compare.h says why 1e-5).
constexpr double kProbeTolerance = course::tolerance_for(torch::kFloat);

// ---- 1. The tutorials' device check ------------------------------------------------------------
// torch.cuda.get_device_name(i): LibTorch's C++ API has no such function; Python's reads the name
// from the GPU's properties, which ATen's CUDA context holds (only a CUDA LibTorch has them).
std::string get_device_name(int index) {
#ifdef GPU_LESSONS_WITH_CUDA
  return at::cuda::getDeviceProperties(index)->name;
#else
  return "no GPU " + std::to_string(index) + ": this LibTorch was built without CUDA";
#endif
}

//! [tutorial]
torch::Device choose_device() {
  // The line every tutorial starts with: the GPU if there is one, else the CPU.
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  std::cout << "Using device: " << device << "\n";
  // Tutorial 000, step 1: say where the training will run, naming the GPU.
  if (torch::cuda::is_available()) {
    std::cout << "Training on GPU: " << get_device_name(0) << "\n";
  } else {
    std::cout << "Training on CPU (GPU not available)\n";
  }
  return device;
}

//! [mps]
// Tutorial 004 checks for "CUDA/MPS": MPS is the GPU of Apple's Macs. The three-way choice, CUDA,
// then MPS, then the CPU: torch::mps::is_available() (torch/mps.h) is in LibTorch 2.x, not 1.13;
// on Linux it answers false, as Python's torch.backends.mps.is_available() does.
torch::Device choose_device_cuda_mps_cpu() {
  if (torch::cuda::is_available()) return torch::kCUDA;
#if GPU_LESSONS_TORCH_AT_LEAST(2, 0)
  if (torch::mps::is_available()) return torch::kMPS;
  std::cout << "torch::mps::is_available(): false\n";
#else
  std::cout << "torch::mps: none in LibTorch " << TORCH_VERSION << " (from 2.0 on)\n";
#endif
  return torch::kCPU;
}
//! [mps]

torch::Tensor first_tensor(const torch::Device& device) {
  // Tutorial 001, "CUDA tensors": create a tensor (on the CPU), then move it to the device.
  torch::Tensor tensor = torch::randn({5, 5});
  tensor = tensor.to(device);
  std::cout << "tensor.device: " << tensor.device() << "\n";
  return tensor;
}
//! [tutorial]

// ---- 2. What LibTorch knows --------------------------------------------------------------------
/// What this LibTorch build and this machine offer.
struct BuildInfo {
  std::string torch_version;    ///< TORCH_VERSION from torch/version.h
  bool cuda_compiled = false;   ///< this program was built against a CUDA LibTorch
  bool cuda_available = false;  ///< torch::cuda::is_available(): CUDA built in and a GPU visible
  int gpu_count = 0;
  bool cudnn_available = false;
};

//! [build-info]
BuildInfo build_info() {
  BuildInfo info;
  info.torch_version = TORCH_VERSION;
  info.cuda_compiled = course::cuda_compiled();
  // is_available() is true only when CUDA is compiled in AND a driver exposes at least one GPU.
  info.cuda_available = torch::cuda::is_available();
  info.gpu_count = course::cuda_device_count();
  info.cudnn_available = torch::cuda::cudnn_is_available();
  return info;
}
//! [build-info]

// ---- 3. How --device strings resolve -----------------------------------------------------------
/// What one --device string turns into on this machine.
struct Resolution {
  std::string spec;       ///< the string, e.g. "cuda:1"
  bool accepted = false;  ///< false: the lesson would exit 2
  std::string outcome;    ///< "cuda:0", "cpu (fallback: ...)" or the error message
};

/// Resolves every form --device accepts (and one it does not), as the lesson prints them.
std::vector<Resolution> resolve_examples() {
  std::vector<Resolution> rows;
  for (const std::string spec : {"auto", "cpu", "cuda", "cuda:0", "cuda:1", "banana"}) {
    Resolution row;
    row.spec = spec;
    try {
      const course::DeviceChoice choice = course::resolve_device(spec);
      row.accepted = true;
      row.outcome = choice.device.str();
      if (!choice.fallback.empty()) row.outcome += " (fallback: " + choice.fallback + ")";
    } catch (const course::UsageError& error) {
      row.outcome = std::string("exit 2: ") + error.what();
    }
    rows.push_back(row);
  }
  return rows;
}

// ---- 4. A first computation on the device ------------------------------------------------------
/// Multiplies two seeded random matrices on `device` and on the CPU; returns the largest
/// absolute difference, relative to the largest CPU value.
//! [probe]
double probe_device(const torch::Device& device, std::uint64_t seed) {
  // Create the inputs on the CPU from a seeded generator, then copy them: the CPU and CUDA
  // random generators differ, so this is how both sides see the same numbers.
  torch::manual_seed(seed);
  const torch::Tensor a = torch::randn({kProbeSize, kProbeSize});
  const torch::Tensor b = torch::randn({kProbeSize, kProbeSize});
  const torch::Tensor expected = torch::mm(a, b);
  // The matmul runs where its inputs live; .to(torch::kCPU) brings the result back (and waits).
  const torch::Tensor on_device = torch::mm(a.to(device), b.to(device)).to(torch::kCPU);
  return course::max_rel_diff(on_device, expected);
}
//! [probe]

}  // namespace lesson01

// ---- main ---------------------------------------------------------------------------------------
//! [main]
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson01.cpp includes this file for its functions
int main(int argc, char** argv) try {
  course::CommonOptions options;
  options.seed = lesson01::kSeed;
  course::Cli cli("lesson01_device_check",
                  "Lesson 01: what LibTorch offers on this machine, and where the course runs.",
                  options);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  //! [main]

  std::cout << "\nThe tutorials' device check:\n";
  const torch::Device tutorial_device = lesson01::choose_device();
  const torch::Tensor tensor = lesson01::first_tensor(tutorial_device);
  const torch::Device auto_device = course::resolve_device("auto").device;
  verdict.check(tutorial_device.type() == auto_device.type(),
                "the tutorials' device is the one --device auto picks", auto_device.str());
  verdict.check(tensor.device().type() == tutorial_device.type(),
                "the tutorial's tensor is on " + tutorial_device.str());
  std::cout << "Tutorial 004's choice, CUDA, then Apple's MPS, then the CPU:\n";
  const torch::Device three_way = lesson01::choose_device_cuda_mps_cpu();
  std::cout << "Using device: " << three_way << "\n";

  std::cout << "\n";
  const lesson01::BuildInfo info = lesson01::build_info();
  std::cout << "LibTorch " << info.torch_version
            << " | CUDA compiled in: " << (info.cuda_compiled ? "yes" : "no")
            << " | CUDA available: " << (info.cuda_available ? "yes" : "no")
            << " | cuDNN: " << (info.cudnn_available ? "yes" : "no")
            << " | GPUs: " << info.gpu_count << "\n";
  const auto gpus = course::list_gpus();
  for (const auto& gpu : gpus) {
    std::cout << "  GPU " << gpu.index << ": " << gpu.name << ", compute capability " << gpu.major
              << "." << gpu.minor << ", " << gpu.multiprocessors << " SMs, "
              << course::format_bytes(static_cast<double>(gpu.total_bytes)) << "\n";
  }
  if (gpus.empty()) std::cout << "  no GPU: " << course::why_no_cuda() << "\n";

  std::cout << "\nHow --device strings resolve on this machine:\n";
  for (const auto& row : lesson01::resolve_examples()) {
    std::cout << "  --device " << row.spec << std::string(8 - row.spec.size(), ' ') << "-> "
              << row.outcome << "\n";
  }

  std::cout << "\nProbe: " << lesson01::kProbeSize << "x" << lesson01::kProbeSize << " matmul on "
            << device << " against the CPU\n";
  const double diff = lesson01::probe_device(device, options.seed);
  verdict.check(diff <= lesson01::kProbeTolerance, "matmul on " + device.str() + " matches the CPU",
                "max relative diff " + std::to_string(diff));
  verdict.check(static_cast<int>(gpus.size()) == info.gpu_count,
                "every GPU LibTorch counts is listed", std::to_string(gpus.size()) + " listed");
  return verdict.finish("lesson 01 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
