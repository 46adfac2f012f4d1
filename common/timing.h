// timing.h defines: a stopwatch that synchronizes the device before reading the clock, the
// median of several timed runs after warm-up (with their spread, and whether it says the machine
// was busy), median() itself, a count of the ATen operators a piece of work dispatches, and the
// device's matrix-product rate.
#pragma once

#include <c10/core/Device.h>  // defines: c10::Device

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace course {

/// Wall-clock time of work on `device`. CUDA work is queued asynchronously, so seconds()
/// synchronizes the device first: otherwise it would measure only the kernel launches.
class Stopwatch {
 public:
  explicit Stopwatch(const c10::Device& device);
  /// Synchronizes, then starts counting from now.
  void restart();
  /// Synchronizes, then returns the seconds since construction or restart().
  double seconds() const;

 private:
  c10::Device device_;
  std::chrono::steady_clock::time_point start_;
};

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> values);

/// Median, fastest and slowest of `runs` timings of `work`, after `warmup` untimed calls.
struct Timing {
  double median_s = 0;
  double min_s = 0;
  double max_s = 0;
  int runs = 0;
};
Timing time_median(const std::function<void()>& work, const c10::Device& device, int warmup,
                   int runs);
/// The median, fastest and slowest of timings already taken (all zero when there are none).
Timing summarize(const std::vector<double>& seconds);
/// The timing of one of `count` equal pieces of work timed together: `t`'s times over `count`.
Timing per_piece(Timing t, double count);

/// How many ATen operators one call of `work` dispatches, on every thread (autograd runs a GPU's
/// backward on threads of its own): counted with LibTorch's RecordFunction callbacks, nested
/// operators included. On a GPU most of them launch a kernel each.
std::int64_t count_operators(const std::function<void()>& work);

/// The device's matrix-product rate in FLOP/s: a 1024 x 1024 float32 product, the median of 5
/// runs after 2 (the rate a small model's compute floor is measured against).
double matmul_rate(const c10::Device& device);

/// "0.412 s (0.391-0.520, 4 runs)": the median, then the fastest and the slowest run; a single
/// run says so: "0.412 s (one run, no spread)".
std::string describe(const Timing& timing, const char* unit = "s");
/// The same in milliseconds: "412.000 ms (391.000-520.000, 4 runs)".
std::string describe_ms(const Timing& timing);
/// True when the slowest run took more than kBusyRatio times the fastest: the machine was busy,
/// and figures taken on it do not repeat.
constexpr double kBusyRatio = 1.5;
bool looks_busy(const Timing& timing);
/// What a lesson prints under a table in which some timing looks_busy(): what happened and how
/// to get figures that repeat.
std::string busy_note();
/// What a lesson prints under its timings, one line ending in a newline, or "" when there is
/// nothing to say: busy_note() when one of them looks_busy(); else, when one of them is a single
/// run, that one run shows no spread, so a busy machine could not be seen in it.
std::string timing_note(const std::vector<Timing>& timings);

}  // namespace course
