#include "common/report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <iostream>

#include "common/interrupt.h"  // defines: Interrupted, StopOnInterrupt

namespace course {

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int size = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string text(size > 0 ? static_cast<size_t>(size) : 0, '\0');
  if (size > 0) std::vsnprintf(text.data(), text.size() + 1, fmt, again);
  va_end(again);
  return text;
}

void report_epoch(const std::string& name, int e, int epochs, const EpochStats& stats,
                  std::int64_t epoch_samples, const std::string& stopped_note) {
  if (stats.interrupted) {
    throw Interrupted(format("%s run, epoch %d of %d, after %lld of %lld samples; %s", name.c_str(),
                             e + 1, epochs, static_cast<long long>(stats.samples),
                             static_cast<long long>(epoch_samples), stopped_note.c_str()));
  }
  std::printf("  %-8s epoch %d/%d  loss %.4f  %6.3f s  %9.0f samples/s\n", name.c_str(), e + 1,
              epochs, stats.mean_loss, stats.seconds,
              stats.seconds > 0 ? static_cast<double>(stats.samples) / stats.seconds : 0.0);
  std::fflush(stdout);
}

std::vector<EpochStats> run_epochs(const std::string& name, int epochs, std::int64_t epoch_samples,
                                   const std::function<EpochStats()>& epoch,
                                   const std::string& stopped_note) {
  StopOnInterrupt stop_on_ctrl_c;
  std::vector<EpochStats> done;
  for (int e = 0; e < epochs; ++e) {
    try {
      done.push_back(epoch());
    } catch (const Interrupted& stop) {
      throw Interrupted(format("%s run, epoch %d of %d, %s; %s", name.c_str(), e + 1, epochs,
                               stop.what(), stopped_note.c_str()));
    }
    report_epoch(name, e, epochs, done.back(), epoch_samples, stopped_note);
  }
  return done;
}

double max_loss_difference(const std::vector<EpochStats>& a, const std::vector<EpochStats>& b) {
  double largest = 0;
  for (size_t e = 0; e < a.size() && e < b.size(); ++e) {
    largest =
        std::max(largest, std::abs(a[e].mean_loss - b[e].mean_loss) / std::abs(b[e].mean_loss));
  }
  return largest;
}

Timing epoch_timing(const std::vector<EpochStats>& epochs) {
  std::vector<double> seconds;
  for (size_t e = epochs.size() > 1 ? 1 : 0; e < epochs.size(); ++e) {
    seconds.push_back(epochs[e].seconds);
  }
  return summarize(seconds);
}

std::string print_timed_runs(const std::vector<TimedRun>& runs, const std::string& time,
                             const std::string& rate, const std::string& figure,
                             const std::string& where) {
  std::string text =
      format("\n%-10s %-33s %11s %15s\n", "run", (time + ": median (fastest-slowest)").c_str(),
             rate.c_str(), figure.c_str());
  std::vector<Timing> timings;
  const bool in_ms = time.rfind("ms/", 0) == 0;
  for (const TimedRun& run : runs) {
    timings.push_back(run.timing);
    const double per_second = run.timing.median_s > 0 ? run.items / run.timing.median_s : 0;
    text += format("%-10s %-32s %12.0f %12.4f\n", run.name.c_str(),
                   (in_ms ? describe_ms(run.timing) : describe(run.timing, "s")).c_str(),
                   per_second, run.figure);
  }
  text += timing_note(timings);
  for (size_t i = 1; i < runs.size(); ++i) {
    text += format("%s is %.2fx the speed of %s on %s\n", runs[i].name.c_str(),
                   runs[i - 1].timing.median_s / runs[i].timing.median_s, runs[i - 1].name.c_str(),
                   where.c_str());
  }
  std::cout << text << std::flush;
  return text;
}

}  // namespace course
