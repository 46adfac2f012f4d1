// interrupt.cpp: the SIGINT handler behind StopOnInterrupt, and an abandoned epoch's message.
#include "common/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace course {
namespace {

std::atomic<bool> requested{false};
struct sigaction previous {};

// Async-signal-safe: an atomic store and write(2). A second Ctrl-C restores the default action
// and raises it again, so an impatient user can still end the process at once.
extern "C" void on_sigint(int) {
  if (requested.exchange(true)) {
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
    return;
  }
  static const char kMessage[] =
      "\n(Ctrl-C: stopping at the end of this step; press it again to quit at once)\n";
  const ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)ignored;
}

}  // namespace

StopOnInterrupt::StopOnInterrupt() {
  requested = false;
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write under way goes on: the loop stops, not I/O
  ::sigaction(SIGINT, &action, &previous);
}

StopOnInterrupt::~StopOnInterrupt() { ::sigaction(SIGINT, &previous, nullptr); }

bool stop_requested() { return requested.load(); }

Interrupted epoch_abandoned(const Interrupted& stop, std::int64_t done,
                            const std::string& checkpoint) {
  const std::string kept = checkpoint.empty() || done == 0
                               ? "nothing is saved"
                               : checkpoint + " holds epoch " + std::to_string(done) +
                                     ": run the same command to resume from there";
  return Interrupted("epoch " + std::to_string(done + 1) + " abandoned " + stop.what() + "; " +
                     kept);
}

}  // namespace course
