// key_averages.h defines: what Python's prof.key_averages().table() prints, for lesson 20, which
// LibTorch's C++ API lacks: a profile's events, summed by name into rows, printed as a table.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>  // defines: ProfilerResult

#include <cstdint>
#include <string>
#include <vector>

namespace lesson20 {

/// One recorded event: an operator or a range on a host thread, or a kernel or copy on the device.
struct Event {
  std::string name;
  double start_us = 0, end_us = 0;
  std::uint64_t thread = 0;         // the host thread; on the device, the stream
  bool on_device = false;           // a kernel or a copy, timed on the GPU
  std::vector<std::int64_t> input;  // the first input's shape, when it has one
};

/// The events of a profile, each with its times in microseconds (profiler.h: by LibTorch version).
std::vector<Event> events_of(const torch::autograd::profiler::ProfilerResult& result);

//! [op-row]
/// One row of prof.key_averages(): every event of one name, summed.
struct OpRow {
  std::string name;
  std::int64_t calls = 0;  // on the host (a GPU's kernels and copies: on the device)
  double self_us = 0;      // host time in the event itself, not in the operators it called
  double total_us = 0;     // host time from its start to its end, callees included
  double device_us = 0;    // kernels and copies: their time on the device
  std::int64_t device_calls = 0;
};
//! [op-row]

/// Sums the events by name (key_averages.cpp: how a self time is found).
std::vector<OpRow> key_averages(std::vector<Event> events);

/// Prints `rows` as prof.key_averages().table(sort_by=..., row_limit=...) does: sort_by "self",
/// "total" or "device".
void print_table(std::vector<OpRow> rows, const std::string& sort_by, int row_limit);

}  // namespace lesson20
