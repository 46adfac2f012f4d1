// timing.cpp: synchronized stopwatch, median timing, counting operators, a matmul's rate.
#include "common/timing.h"

#include <ATen/Functions.h>        // defines: at::rand, at::mm
#include <ATen/record_function.h>  // defines: at::addGlobalCallback, at::removeCallback

#include <algorithm>
#include <atomic>
#include <cstdio>
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
  return summarize(seconds);
}

Timing summarize(const std::vector<double>& seconds) {
  Timing timing;
  if (seconds.empty()) return timing;
  timing.runs = static_cast<int>(seconds.size());
  timing.min_s = *std::min_element(seconds.begin(), seconds.end());
  timing.max_s = *std::max_element(seconds.begin(), seconds.end());
  timing.median_s = median(seconds);
  return timing;
}

Timing per_piece(Timing t, double count) {
  t.median_s /= count;
  t.min_s /= count;
  t.max_s /= count;
  return t;
}

std::string describe(const Timing& timing, const char* unit) {
  char text[160];
  if (timing.runs == 1) {
    std::snprintf(text, sizeof text, "%.3f %s (one run, no spread)", timing.median_s, unit);
  } else {
    std::snprintf(text, sizeof text, "%.3f %s (%.3f-%.3f, %d runs)", timing.median_s, unit,
                  timing.min_s, timing.max_s, timing.runs);
  }
  return text;
}

std::string describe_ms(const Timing& timing) {
  Timing ms = timing;
  ms.median_s *= 1e3;
  ms.min_s *= 1e3;
  ms.max_s *= 1e3;
  return describe(ms, "ms");
}

bool looks_busy(const Timing& timing) {
  return timing.runs > 1 && timing.min_s > 0 && timing.max_s > kBusyRatio * timing.min_s;
}

std::string busy_note() {
  char text[256];
  std::snprintf(text, sizeof text,
                "note: some runs took more than %.1f times the fastest: this machine was busy, and "
                "such figures do not repeat (close other programs, or try --threads 1)",
                kBusyRatio);
  return text;
}

std::string timing_note(const std::vector<Timing>& timings) {
  const auto any = [&](bool (*test)(const Timing&)) {
    return std::any_of(timings.begin(), timings.end(), test);
  };
  if (any(looks_busy)) return busy_note() + "\n";
  if (any([](const Timing& t) { return t.runs == 1; })) {
    return "note: one run, so no spread: a busy machine would not show in it; take a median of "
           "several (more epochs, or without --quick) before comparing\n";
  }
  return "";
}

std::int64_t count_operators(const std::function<void()>& work) {
  static std::atomic<std::int64_t> count{0};
  count = 0;
  const at::CallbackHandle handle =
      at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction&)
                                                           -> std::unique_ptr<at::ObserverContext> {
                              count.fetch_add(1, std::memory_order_relaxed);
                              return nullptr;
                            }).scopes({at::RecordScope::FUNCTION}));
  work();
  at::removeCallback(handle);
  return count.load();
}

double matmul_rate(const c10::Device& device) {
  const at::Tensor a = at::rand({1024, 1024}, at::TensorOptions().device(device));
  const Timing t = time_median([&] { at::mm(a, a); }, device, 2, 5);
  return 2.0 * 1024 * 1024 * 1024 / t.median_s;
}

}  // namespace course
