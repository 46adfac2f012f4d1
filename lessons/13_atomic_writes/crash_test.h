// crash_test.h defines: lesson 13's crash test, a program killed (SIGKILL) again and again at a
// random moment of its work, and what it left behind checked after each kill (kill_repeatedly).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace lesson13 {

/// A crash test's kill: starts `argv`, a program that prints a line each time it finishes a piece
/// of work, waits for `lines` lines, then kills it (SIGKILL) at a moment drawn from `random` within
/// the time its last piece took, so that most kills land in the middle of the next piece.
/// Returns that time in seconds; std::runtime_error when the program stops printing first.
double kill_at_random_moment(const std::vector<std::string>& argv, int lines,
                             std::mt19937_64& random);

/// What a crash test found (kill_repeatedly).
struct KillReport {
  int kills = 0;
  int survived = 0;          ///< kills after which `check` passed
  double piece_seconds = 0;  ///< the median time of the child's piece of work
  std::string failure;       ///< the first failed check's message, if any
};
/// A crash test: `kills` times, kill_at_random_moment(argv, lines, ...) with a generator seeded
/// with `seed`, then `check()`, which throws (a std::exception saying what is wrong) when what the
/// killed child left behind is not whole.
KillReport kill_repeatedly(const std::vector<std::string>& argv, int lines, int kills,
                           std::uint64_t seed, const std::function<void()>& check);

}  // namespace lesson13
