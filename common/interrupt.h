// interrupt.h defines: Ctrl-C for training loops. While a StopOnInterrupt lives, the first SIGINT
// only asks the loop to stop at the end of its current step (a second one ends the process at
// once); the loop checks stop_requested() and reports its stop by throwing Interrupted, which
// report_error() turns into its message and exit code 130, as a shell reports a Ctrl-C; and what a
// loop that saves a checkpoint after every epoch says when it stops (epoch_abandoned).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace course {

constexpr int kExitInterrupted = 130;  // 128 + SIGINT

/// Turns SIGINT into a stop request while it lives; restores the previous handler after.
class StopOnInterrupt {
 public:
  StopOnInterrupt();
  ~StopOnInterrupt();
  StopOnInterrupt(const StopOnInterrupt&) = delete;
  StopOnInterrupt& operator=(const StopOnInterrupt&) = delete;
};

/// True once a SIGINT arrived under a StopOnInterrupt (cleared when the next one is made).
bool stop_requested();

/// A loop that stopped on request: what it did and what is left, as one line.
class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What an epoch loop says when `stop` ended its epoch `done` + 1: "epoch 3 abandoned after step
/// 12; run.pt holds epoch 2: run the same command to resume from there", where `checkpoint` is
/// the file it saves after every epoch ("nothing is saved" when it is empty or `done` is 0).
Interrupted epoch_abandoned(const Interrupted& stop, std::int64_t done,
                            const std::string& checkpoint);

}  // namespace course
