// timing.h defines: a stopwatch that synchronizes the device before reading the clock, the
// median of several timed runs after warm-up, and median() itself.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include <c10/core/Device.h>  // defines: c10::Device

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

}  // namespace course
