// profiler.h defines: what differs between LibTorch 1.13's profiler and 2.x's, for lesson 20:
// an event's start and length in microseconds, and writing a profile as a Chrome trace.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>  // defines: KinetoEvent, ProfilerResult

#include <string>

namespace lesson20 {

/// When `event` started, in microseconds (1.13 gives startUs(), 2.x startNs()).
double event_start_us(const torch::autograd::profiler::KinetoEvent& event);
/// How long `event` took, in microseconds (1.13 gives durationUs(), 2.x durationNs()).
double event_duration_us(const torch::autograd::profiler::KinetoEvent& event);

/// Writes `result` to `path` as a Chrome trace (JSON; it opens in chrome://tracing or
/// ui.perfetto.dev), whole or not at all (a temporary file renamed into place). A LibTorch built
/// with Kineto (the PyPI wheels) writes its own trace, GPU kernels and copies included
/// (ProfilerResult::save). One built without it (Debian's 1.13) refuses to save ("requires ...
/// USE_KINETO=1"): then the events are written here in the same format, one complete event
/// ("ph": "X") per operator and range on the thread that ran it, with the input shapes when they
/// were recorded. Returns true when Kineto wrote the trace. Throws CourseError when `path`
/// cannot be written (Kineto also refuses to save one result twice: "Trace is already saved").
bool save_chrome_trace(torch::autograd::profiler::ProfilerResult& result, const std::string& path);

/// Throws CourseError (exit 2, with a HINT) when the folder of the trace file `path` does not
/// exist: a program that will save a trace checks it before its run.
void check_trace_folder(const std::string& path);

}  // namespace lesson20
