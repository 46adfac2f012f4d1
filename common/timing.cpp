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

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
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
  Timing timing;
  timing.runs = static_cast<int>(seconds.size());
  timing.min_s = *std::min_element(seconds.begin(), seconds.end());
  timing.max_s = *std::max_element(seconds.begin(), seconds.end());
  timing.median_s = median(seconds);
  return timing;
}

}  // namespace course
