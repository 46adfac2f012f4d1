// profiler.cpp: the profiler's version differences (see profiler.h).
#include "profiler.h"

#include <unistd.h>  // getpid

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "common/verdict.h"  // defines: CourseError
#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace lesson20 {
namespace {

using torch::autograd::profiler::KinetoEvent;

// `text` as a JSON string, quotes included.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The events as Chrome's trace format: {"traceEvents": [{"ph": "X", ...}, ...]}.
void write_events(const std::vector<KinetoEvent>& events, std::ostream& out) {
  const int pid = static_cast<int>(::getpid());
  out << std::fixed << std::setprecision(3);  // microseconds, to the nanosecond
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  for (const KinetoEvent& event : events) {
    out << (first ? "" : ",\n") << "{\"ph\": \"X\", \"cat\": "
        << (event.scope() == static_cast<std::uint8_t>(at::RecordScope::USER_SCOPE)
                ? "\"user_annotation\""
                : "\"cpu_op\"")
        << ", \"name\": " << json_string(event.name()) << ", \"pid\": " << pid
        << ", \"tid\": " << event.startThreadId() << ", \"ts\": " << event_start_us(event)
        << ", \"dur\": " << event_duration_us(event);
    if (event.hasShapes()) {
      out << ", \"args\": {\"Input Dims\": [";
      const auto shapes = event.shapes();
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        out << (i ? ", [" : "[");
        for (std::size_t j = 0; j < shapes[i].size(); ++j) out << (j ? ", " : "") << shapes[i][j];
        out << "]";
      }
      out << "]}";
    }
    out << "}";
    first = false;
  }
  out << "\n]}\n";
}

}  // namespace

double event_start_us(const KinetoEvent& event) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 0)
  return static_cast<double>(event.startNs()) / 1000.0;
#else
  return static_cast<double>(event.startUs());
#endif
}

double event_duration_us(const KinetoEvent& event) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 0)
  return static_cast<double>(event.durationNs()) / 1000.0;
#else
  return static_cast<double>(event.durationUs());
#endif
}

void check_trace_folder(const std::string& path) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!folder.empty() && !std::filesystem::is_directory(folder, error)) {
    throw course::CourseError(
        "no folder " + folder.string() + " for the trace " + path,
        "give --trace a file in a folder that exists (or make the folder first)");
  }
}

bool save_chrome_trace(torch::autograd::profiler::ProfilerResult& result, const std::string& path) {
  check_trace_folder(path);
  const std::string part = path + ".part";
  const std::string hint = "give --trace a file in a folder that exists and can be written";
  std::error_code error;
  std::filesystem::remove(part, error);  // a part file of an earlier run is never taken
  bool kineto = true;
  try {
    result.save(part);
  } catch (const c10::Error& e) {
    // LibTorch without Kineto refuses: "Saving a trace requires ... Kineto support
    // (USE_KINETO=1)". Any other error is the caller's to see.
    if (std::string(e.what()).find("USE_KINETO") == std::string::npos) throw;
    kineto = false;
  }
  if (!kineto) {
    std::ofstream out(part);
    if (out) write_events(result.events(), out);
    out.close();
    if (!out) {
      std::filesystem::remove(part, error);  // no half-written file left behind
      throw course::CourseError("cannot write the trace " + path, hint);
    }
  }
  if (!std::filesystem::is_regular_file(part, error) ||
      std::filesystem::file_size(part, error) == 0)
    throw course::CourseError("the profiler wrote no trace to " + path, hint);
  std::filesystem::rename(part, path, error);
  if (error) {
    const std::string why = error.message();
    std::filesystem::remove(part, error);
    throw course::CourseError("cannot write the trace " + path + ": " + why, hint);
  }
  return kineto;
}

}  // namespace lesson20
