// Lesson 03 — moving tensors: what .to(device) copies, what it does not, and how fast.
//
// You will learn:
//   - the tutorial's move, line for line: a tensor made on the CPU, .to(device), each device
//     printed;
//   - t.to(device) returns t itself (no copy) when t is already there; otherwise it copies into
//     new memory on the device and leaves t untouched;
//   - create tensors directly on the device (torch::randn(..., device)) rather than creating
//     them on the CPU and copying, unless the numbers must match the CPU's;
//   - the CPU and CUDA random generators differ: the same seed gives different numbers, so
//     create on the CPU and move when results must be identical;
//   - pinned (page-locked) host memory makes host-to-device copies faster and lets
//     non_blocking=true overlap them with other work;
//   - a loop over a tensor's elements with .item() pays a copy (on a GPU, a wait) per element:
//     copy once and loop over an accessor, or let one tensor op do the whole loop where the data
//     is (at 10,000 elements the accessor loop keeps up on either device: the transcripts).
//
// Run:    build/bin/lesson03_moving_tensors [--device auto|cpu|cuda|cuda:N] [--quick]
// Checks: the tutorial's tensor lands on the device (and is the same tensor when the device is
//         the CPU, as the tutorial notes); the facts above, each on the chosen device (the
//         CUDA-only ones print "(skipped: needs CUDA)" on the CPU); the three sums of squares
//         agree. Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::Tensor, its .to(), torch::randn, pin_memory

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/timing.h"   // defines: Timing, time_median, describe_ms, timing_note
#include "common/verdict.h"  // defines: Verdict, report_error

namespace lesson03 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 3;
constexpr std::int64_t kSmall = 1000;          // elements in the tensors the checks move
constexpr std::int64_t kCopyBytes = 64 << 20;  // 64 MiB: large enough to measure bandwidth
constexpr std::int64_t kCopyBytesQuick = 8 << 20;
constexpr int kTimedRuns = 5;                  // median of this many, after one warm-up
constexpr std::int64_t kLoopElements = 10000;  // the sum of squares computed three ways
constexpr std::int64_t kLoopElementsQuick = 2000;

// ---- 1. The tutorial's move --------------------------------------------------------------------
/// The two tensors of the tutorial's lines.
struct TutorialTensors {
  torch::Tensor cpu_tensor, gpu_tensor;
};

//! [tutorial]
TutorialTensors tutorial_move(const torch::Device& device) {
  // Create a tensor on the CPU (the default)
  torch::Tensor cpu_tensor = torch::randn({2, 3});
  std::cout << "Original tensor device: " << cpu_tensor.device() << "\n";
  // Move the tensor to the selected device
  torch::Tensor gpu_tensor = cpu_tensor.to(device);
  std::cout << "New tensor device: " << gpu_tensor.device() << "\n";
  return {cpu_tensor, gpu_tensor};
}
//! [tutorial]

// ---- 2. What .to() copies ----------------------------------------------------------------------
/// What .to() gave back.
struct MoveFacts {
  bool same_tensor = false;   ///< the very same tensor object came back: no copy at all
  bool new_storage = false;   ///< the result's numbers live in different memory
  bool equal_values = false;  ///< the result holds the same numbers
};

namespace {  // compare() is this file's own helper: no other file can call it
MoveFacts compare(const torch::Tensor& original, const torch::Tensor& result) {
  MoveFacts facts;
  facts.same_tensor = result.is_same(original);  // the two handles name one tensor object
  facts.new_storage = result.data_ptr() != original.data_ptr();  // the numbers' addresses differ
  facts.equal_values = torch::equal(result.to(torch::kCPU), original.to(torch::kCPU));
  return facts;
}
}  // namespace

/// `t.to(device)` for a tensor already on `device`.
//! [to-same]
MoveFacts to_same_device(const torch::Device& device) {
  const torch::Tensor t = torch::arange(kSmall, torch::TensorOptions().device(device));
  return compare(t, t.to(device));  // already there: .to() hands back t itself
}
//! [to-same]

/// `t.to(device, /*non_blocking=*/false, /*copy=*/true)`: a copy even when already there.
MoveFacts forced_copy(const torch::Device& device) {
  const torch::Tensor t = torch::arange(kSmall, torch::TensorOptions().device(device));
  return compare(t, t.to(device, /*non_blocking=*/false, /*copy=*/true));
}

/// A CPU tensor `.to(device)`; on a CUDA device this is a host-to-device copy.
//! [to-other]
MoveFacts cpu_to(const torch::Device& device) {
  const torch::Tensor host = torch::arange(kSmall);
  return compare(host, host.to(device));  // a new tensor in device memory; host is unchanged
}
//! [to-other]

/// Same seed, same call, on the CPU and on `device`: are the random numbers identical?
//! [seeds]
bool same_seed_same_numbers(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // seeds the CPU generator and every CUDA generator
  const torch::Tensor on_cpu = torch::randn({kSmall});
  torch::manual_seed(seed);
  const torch::Tensor on_device = torch::randn({kSmall}, torch::TensorOptions().device(device));
  return torch::equal(on_cpu, on_device.to(torch::kCPU));
}

/// Random numbers made on the CPU and moved: identical on both sides by construction.
bool create_on_cpu_then_move_matches(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor on_cpu = torch::randn({kSmall});
  const torch::Tensor moved = on_cpu.to(device);  // same numbers, now on the device
  return torch::equal(on_cpu, moved.to(torch::kCPU));
}
//! [seeds]

/// A pinned host tensor copied with non_blocking=true arrives intact (CUDA only).
//! [pinned]
bool pinned_non_blocking_copy_matches(const torch::Device& device) {
  const torch::Tensor host = torch::rand({kSmall}).pin_memory();  // page-locked host memory
  // non_blocking=true returns at once; the copy runs on the GPU's stream. Any later op on that
  // stream (here .to(kCPU)) is ordered after it, so no explicit synchronize is needed here.
  const torch::Tensor on_device = host.to(device, /*non_blocking=*/true);
  return host.is_pinned() && torch::equal(host, on_device.to(torch::kCPU));
}
//! [pinned]

/// Host-to-device copy bandwidth in GB/s, from pageable or pinned host memory (CUDA only).
double copy_bandwidth(const torch::Device& device, std::int64_t bytes, bool pinned) {
  torch::Tensor host = torch::ones({bytes / 4});
  if (pinned) host = host.pin_memory();
  const course::Timing timing = course::time_median(
      [&] { host.to(device, /*non_blocking=*/pinned); }, device, /*warmup=*/1, kTimedRuns);
  return static_cast<double>(bytes) / timing.median_s / 1e9;
}

// ---- 3. One computation, three ways ------------------------------------------------------------
/// The sum of x[i]² over a 1-D float tensor, with a C++ loop that reads each element with
/// `.item()`: one small copy to the host (and, on a GPU, one wait for it) per element.
//! [item-loop]
// Python: total = 0.0; for i in range(len(x)): total += x[i].item() ** 2
double sum_of_squares_item_loop(const torch::Tensor& x) {
  double total = 0;
  for (std::int64_t i = 0; i < x.size(0); ++i) {
    const double v = x[i].item<double>();  // x[i] is a tensor; .item() copies it to the host
    total += v * v;
  }
  return total;
}
//! [item-loop]

/// The same with one copy to the host and a loop over a CPU accessor (plain C++ array reads).
//! [accessor-loop]
// Python: values = x.cpu().tolist(); total = sum(v * v for v in values)
double sum_of_squares_accessor_loop(const torch::Tensor& x) {
  const torch::Tensor host = x.to(torch::kCPU).contiguous();  // one copy of the whole tensor
  const auto a = host.accessor<float, 1>();  // plain reads of the host memory, no tensor ops
  double total = 0;
  for (std::int64_t i = 0; i < a.size(0); ++i) total += static_cast<double>(a[i]) * a[i];
  return total;
}
//! [accessor-loop]

/// The same in one tensor op, on x's own device; one `.item()` brings the result back.
//! [vectorized]
// Python: total = (x.double() ** 2).sum().item()
double sum_of_squares_vectorized(const torch::Tensor& x) {
  // >>> lab: the whole loop as tensor ops on x's device (in double, as the loops add), one .item()
  return x.to(torch::kDouble).square().sum().item<double>();
  // <<< lab
}
//! [vectorized]

// ---- the program's steps (main, below, runs them in order) --------------------------------------
// Prints the times of creating `bytes` of random numbers on
// the device and on the CPU then moved, and on a GPU the bandwidth of host-to-device copies,
// pageable and pinned.
void print_creation_and_copies(const torch::Device& device, std::int64_t bytes,
                               const course::Timing& direct, const course::Timing& via_cpu) {
  std::cout << "Creating " << bytes / (1 << 20) << " MiB of random numbers, median (fastest-"
            << "slowest):\n  directly on " << device << ": " << course::describe_ms(direct)
            << "\n  on the CPU, then .to(" << device << "): " << course::describe_ms(via_cpu)
            << "\n";
  std::cout << course::timing_note({direct, via_cpu});  // a busy machine: says so
  if (device.is_cuda()) {
    std::cout << "Host-to-device copy of " << bytes / (1 << 20) << " MiB: pageable "
              << copy_bandwidth(device, bytes, false) << " GB/s, pinned "
              << copy_bandwidth(device, bytes, true) << " GB/s\n";
  }
}

// The three ways on `device`: the same result, timed side by side.
void compare_three_ways(const torch::Device& device, std::int64_t n, course::Verdict& verdict) {
  torch::manual_seed(kSeed);
  const torch::Tensor x = torch::rand({n}).to(device);
  std::cout << "\nThe sum of x[i]^2 over " << n << " numbers on " << device << ", three ways:\n";
  // Each way is timed alike: one warm-up run, then the median of kTimedRuns.
  //! [three-ways]
  auto time_way = [&](const std::function<void()>& way) {
    return course::time_median(way, device, /*warmup=*/1, kTimedRuns);
  };
  double results[3];
  const course::Timing times[3] = {time_way([&] { results[0] = sum_of_squares_item_loop(x); }),
                                   time_way([&] { results[1] = sum_of_squares_accessor_loop(x); }),
                                   time_way([&] { results[2] = sum_of_squares_vectorized(x); })};
  //! [three-ways]
  const char* names[3] = {"loop, .item() per element", "copy once, loop over an accessor",
                          "one tensor op"};
  double seconds[3];
  for (int w = 0; w < 3; ++w) {
    seconds[w] = times[w].median_s;
    std::printf("  %-34s %-34s = %.6f\n", names[w], course::describe_ms(times[w]).c_str(),
                results[w]);
  }
  std::cout << course::timing_note({times[0], times[1], times[2]});
  std::printf("  the loop with .item() took %.0fx the time of the tensor op\n",
              seconds[0] / seconds[2]);
  const double tolerance = 1e-9 * std::abs(results[2]);  // double sums, added in other orders
  verdict.check(std::abs(results[0] - results[2]) <= tolerance &&
                    std::abs(results[1] - results[2]) <= tolerance,
                "the element loop, the accessor loop and the tensor op give the same sum");
}

}  // namespace lesson03

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson03.cpp and benchmarks/bench_matmul.cpp include it
int main(int argc, char** argv) try {
  using namespace lesson03;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("lesson03_moving_tensors",
                  "Lesson 03: what .to(device) copies, pinned memory, and seeds across devices.",
                  options);
  if (auto code = cli.parse(argc, argv)) return *code;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);  // tutorials'
  device = course::start_lesson(options, device);  // --device may override it; printed first
  const bool cuda = device.is_cuda();
  course::Verdict verdict;

  std::cout << "The tutorial's move (tutorial 003, part 1.2):\n";
  const TutorialTensors tutorial = tutorial_move(device);
  verdict.check(tutorial.gpu_tensor.device() == device &&
                    torch::equal(tutorial.gpu_tensor.to(torch::kCPU), tutorial.cpu_tensor),
                "the tutorial's tensor is on " + device.str() + " with the same numbers");
  if (!cuda) {
    verdict.check(tutorial.gpu_tensor.is_same(tutorial.cpu_tensor),
                  "as the tutorial notes, .to(cpu) returns the original tensor, without a copy");
  }
  std::cout << "\n";

  const MoveFacts same = to_same_device(device);
  verdict.check(same.same_tensor,
                "t.to(" + device.str() + ") on a tensor already there is t itself", "no copy");
  const MoveFacts forced = forced_copy(device);
  verdict.check(!forced.same_tensor && forced.new_storage && forced.equal_values,
                "t.to(device, non_blocking=false, copy=true) makes a real copy");
  const MoveFacts moved = cpu_to(device);
  if (cuda) {
    verdict.check(moved.new_storage && moved.equal_values,
                  "a CPU tensor .to(" + device.str() + ") is a new tensor with the same numbers");
  } else {
    verdict.check(moved.same_tensor, "a CPU tensor .to(cpu) is the tensor itself");
  }

  verdict.check(create_on_cpu_then_move_matches(device, options.seed),
                "random numbers made on the CPU and moved are identical on both sides");
  if (cuda) {
    verdict.check(!same_seed_same_numbers(device, options.seed),
                  "the same seed gives different numbers on the CPU and on CUDA",
                  "different generators: create on the CPU and move when results must match");
    verdict.check(pinned_non_blocking_copy_matches(device),
                  "a pinned tensor copied with non_blocking=true arrives intact");
  } else {
    std::cout << "  same seed on CPU vs CUDA (skipped: needs CUDA)\n"
              << "  pinned memory and non_blocking copies (skipped: needs CUDA)\n";
  }

  // Not checked, only measured: timing depends on the machine.
  //! [create-where]
  const std::int64_t bytes = options.quick ? kCopyBytesQuick : kCopyBytes;
  const std::int64_t n = bytes / 4;
  const auto direct = course::time_median(
      [&] { torch::randn({n}, torch::TensorOptions().device(device)); }, device, 1, kTimedRuns);
  const auto via_cpu =
      course::time_median([&] { torch::randn({n}).to(device); }, device, 1, kTimedRuns);
  //! [create-where]
  print_creation_and_copies(device, bytes, direct, via_cpu);
  compare_three_ways(device, options.quick ? kLoopElementsQuick : kLoopElements, verdict);
  return verdict.finish("lesson 03 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
