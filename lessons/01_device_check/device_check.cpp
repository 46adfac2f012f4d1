// Lesson 01 — device check: what does this machine offer, and where will the course run?
//
// You will learn:
//   - how to ask LibTorch which version it is and whether it was built with CUDA;
//   - how many GPUs it sees, and each GPU's name, compute capability and memory;
//   - how the course turns --device auto|cpu|cuda|cuda:N into a torch::Device, falling back
//     to the CPU (with the reason printed) when no GPU is usable;
//   - that work on the chosen device gives the same numbers as on the CPU.
//
// Run:    build/bin/lesson01_device_check [--device auto|cpu|cuda|cuda:N]
// Checks: a matmul on the chosen device matches the CPU within kProbeTolerance (relative), and
//         the GPU count agrees with the GPUs listed. Exit 0 PASS, 1 FAIL, 2 bad flag
//         (an unknown device, or a GPU index past the count).
#include <torch/torch.h>    // defines: torch::cuda, torch::mm, torch::randn
#include <torch/version.h>  // defines: TORCH_VERSION

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/compare.h"  // defines: max_rel_diff, tolerance_for
#include "common/device.h"   // defines: resolve_device, list_gpus, format_bytes
#include "common/verdict.h"  // defines: Verdict, report_error

namespace lesson01 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 1;        // the probe's inputs derive from it
constexpr std::int64_t kProbeSize = 512;  // side of the square matmul run on the chosen device
// An fp32 matmul on two devices: the same sums in another order (common/compare.h says why 1e-5).
constexpr double kProbeTolerance = course::tolerance_for(torch::kFloat);

// ---- what LibTorch knows -----------------------------------------------------------------------
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

// ---- how --device strings resolve --------------------------------------------------------------
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

// ---- a first computation on the device ---------------------------------------------------------
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
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson01.cpp includes this file for its functions
int main(int argc, char** argv) try {
  course::CommonOptions options;
  options.seed = lesson01::kSeed;
  course::Cli cli("lesson01_device_check",
                  "Lesson 01: what LibTorch offers on this machine, and where the course runs.",
                  options);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);

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

  course::Verdict verdict;
  verdict.check(diff <= lesson01::kProbeTolerance, "matmul on " + device.str() + " matches the CPU",
                "max relative diff " + std::to_string(diff));
  verdict.check(static_cast<int>(gpus.size()) == info.gpu_count,
                "every GPU LibTorch counts is listed", std::to_string(gpus.size()) + " listed");
  return verdict.finish("lesson 01 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
