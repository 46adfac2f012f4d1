// key_averages.cpp: the op table Python prints with prof.key_averages().table() (see
// key_averages.h).
#include "key_averages.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "profiler.h"  // defines: event_start_us, event_duration_us

namespace lesson20 {

//! [table]
// A profile's events, copied out of LibTorch's KinetoEvents.
std::vector<Event> events_of(const torch::autograd::profiler::ProfilerResult& result) {
  std::vector<Event> events;
  for (const auto& e : result.events()) {
    Event event{
        e.name(), event_start_us(e), 0, e.startThreadId(), e.deviceType() != c10::DeviceType::CPU,
        {}};
    event.end_us = event.start_us + event_duration_us(e);
    if (e.hasShapes() && !e.shapes().empty()) event.input = e.shapes()[0];
    events.push_back(std::move(event));
  }
  return events;
}

// Sums the events by name. An event's self time is its length less the lengths of the events
// directly inside it on the same thread (aten::linear's self time leaves out its aten::addmm).
// Which event is inside which comes from their times: sorted by start (the longer first), each
// event's parent is the last one still open when it starts. (LibTorch 1.13 gives whole
// microseconds, so there a self time may be off by a microsecond.)
std::vector<OpRow> key_averages(std::vector<Event> events) {
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    return a.start_us != b.start_us ? a.start_us < b.start_us : a.end_us > b.end_us;  // outer first
  });
  std::map<std::string, OpRow> rows;
  std::vector<const Event*> open;  // the host events enclosing the current one, outermost first
  for (const Event& e : events) {
    OpRow& row = rows[e.name];
    row.name = e.name;
    const double length = e.end_us - e.start_us;
    if (e.on_device) {  // a kernel, a copy, or a range's span on the GPU (named as the range)
      row.device_us += length;
      ++row.device_calls;
      continue;
    }
    ++row.calls;
    row.total_us += length;
    row.self_us += length;
    while (!open.empty() && (open.back()->thread != e.thread || open.back()->end_us < e.end_us))
      open.pop_back();  // those that ended before e did, or ran on another thread
    if (!open.empty()) rows[open.back()->name].self_us -= length;  // e's time is not its parent's
    open.push_back(&e);
  }
  std::vector<OpRow> table;
  for (auto& [name, row] : rows) table.push_back(row);
  return table;
}

// prof.key_averages().table(sort_by=..., row_limit=10): sort_by "self" is Python's
// "self_cpu_time_total", "total" its "cpu_time_total", "device" its "cuda_time_total".
void print_table(std::vector<OpRow> rows, const std::string& sort_by, int row_limit) {
  const auto key = [&](const OpRow& r) {
    return sort_by == "device" ? r.device_us : sort_by == "total" ? r.total_us : r.self_us;
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const OpRow& a, const OpRow& b) { return key(a) > key(b); });
  const bool by_device = sort_by == "device";
  std::printf("  %-40s %7s %12s %12s %12s%s\n", "Name", "# Calls", "Self CPU", "CPU total",
              "CPU avg", by_device ? "    Device total" : "");
  for (int i = 0; i < row_limit && i < static_cast<int>(rows.size()); ++i) {
    const OpRow& r = rows[i];
    const std::string name = r.name.size() > 40 ? r.name.substr(0, 37) + "..." : r.name;
    const std::int64_t calls = r.calls > 0 ? r.calls : r.device_calls;
    std::printf("  %-40s %7lld %9.0f us %9.0f us %9.1f us", name.c_str(),
                static_cast<long long>(calls), r.self_us, r.total_us,
                r.total_us / static_cast<double>(calls));
    if (by_device) std::printf(" %12.0f us", r.device_us);
    std::printf("\n");
  }
}
//! [table]

}  // namespace lesson20
