// timing.cpp: synchronized stopwatch and median timing.
#include "common/timing.h"

#include <algorithm>
#include <vector>

#include "common/device.h"

namespace course {

Stopwatch::Stopwatch(const c10::Device& device) : device_(device) { restart(); }

void Stopwatch::restart() {
  synchronize(device_);
  start_ = std::chrono::steady_clock::now();
}

double Stopwatch::seconds() const {
  synchronize(device_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

Timing time_median(const std::function<void()>& work, const c10::Device& device, int warmup,
                   int runs) {
  for (int i = 0; i < warmup; ++i) work();
  std::vector<double> seconds;
  Stopwatch watch(device);
  for (int i = 0; i < std::max(runs, 1); ++i) {
    watch.restart();
    work();
    seconds.push_back(watch.seconds());
  }
  std::sort(seconds.begin(), seconds.end());
  Timing timing;
  timing.runs = static_cast<int>(seconds.size());
  timing.min_s = seconds.front();
  timing.max_s = seconds.back();
  const size_t mid = seconds.size() / 2;
  timing.median_s =
      seconds.size() % 2 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
  return timing;
}

}  // namespace course
