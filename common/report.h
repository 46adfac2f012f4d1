// report.h defines: what a lesson prints around its figures without teaching it: printf into a
// std::string, a training epoch's figures and its line (or the
// Ctrl-C stop it ended in), a run of epochs that Ctrl-C stops, how far apart two runs' losses
// are, and a table of timed runs (each run's speed against the run before it, and a note when
// the timings say the machine was busy).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/timing.h"  // defines: Timing, describe, looks_busy, busy_note

namespace course {

/// printf's formatting, into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/// What one training epoch did.
struct EpochStats {
  double mean_loss = 0, seconds = 0;
  std::int64_t samples = 0;
  bool interrupted = false;  ///< stopped early by Ctrl-C (common/interrupt.h)
};
/// Prints "  NAME     epoch E/N  loss L  S s  R samples/s" for epoch `e` (from 0) of `epochs`,
/// flushed (a line per epoch, also through a pipe); or, for an interrupted epoch, throws
/// Interrupted: "NAME run, epoch E of N, after S of `epoch_samples` samples; " + `stopped_note`.
void report_epoch(const std::string& name, int e, int epochs, const EpochStats& stats,
                  std::int64_t epoch_samples, const std::string& stopped_note);
/// A run of `epochs` epochs named `name`, each by `epoch()` and printed by report_epoch, while a
/// StopOnInterrupt lives: a Ctrl-C stops the run after the step under way. An epoch that says it
/// was interrupted throws there; a loop that throws Interrupted itself (train_epoch in ann.h:
/// "after step S") is rethrown as "NAME run, epoch E of N, after step S; " + `stopped_note`.
/// Returns each epoch's figures.
std::vector<EpochStats> run_epochs(const std::string& name, int epochs, std::int64_t epoch_samples,
                                   const std::function<EpochStats()>& epoch,
                                   const std::string& stopped_note);
/// The largest relative difference |a - b| / |b| of two runs' mean losses, epoch by epoch (over
/// the epochs both have; 0 when none).
double max_loss_difference(const std::vector<EpochStats>& a, const std::vector<EpochStats>& b);
/// The epochs' seconds, the first left out when there are others: it also pays for warm-up (the
/// allocator's first blocks, the first choice of kernels).
Timing epoch_timing(const std::vector<EpochStats>& epochs);

/// One row of a table of timed runs: its name, its timings, the items one run handles (for a
/// rate at the median time) and one more figure of the run (an accuracy, a loss).
struct TimedRun {
  std::string name;
  Timing timing;
  double items = 0;
  double figure = 0;
};

/// Prints a header (run, `time` + ": median (fastest-slowest)", `rate`, `figure`), then a row per
/// run: its name, describe(timing, "s") (describe_ms when `time` starts with "ms/"), items per
/// second and the figure (4 decimals); timing_note(); then each run's speed against the run
/// before it ("b is 1.50x the speed of a on cpu", `where` = "cpu"). Returns the rows as printed.
std::string print_timed_runs(const std::vector<TimedRun>& runs, const std::string& time,
                             const std::string& rate, const std::string& figure,
                             const std::string& where);

}  // namespace course
