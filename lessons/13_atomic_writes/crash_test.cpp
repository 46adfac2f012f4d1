// crash_test.cpp: lesson 13's crash test over common/child_process.h's ChildProcess.
#include "crash_test.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "common/child_process.h"  // defines: ChildProcess

namespace lesson13 {

double kill_at_random_moment(const std::vector<std::string>& argv, int lines,
                             std::mt19937_64& random) {
  course::ChildProcess child(argv);
  std::string line;
  auto last = std::chrono::steady_clock::now();
  double piece = 0;  // seconds the last piece of work took
  for (int i = 0; i < lines; ++i) {
    if (!child.read_line(line)) {
      throw std::runtime_error(argv[0] + " stopped after " + std::to_string(i) + " of " +
                               std::to_string(lines) + " lines");
    }
    const auto now = std::chrono::steady_clock::now();
    piece = std::chrono::duration<double>(now - last).count();
    last = now;
  }
  std::uniform_real_distribution<double> when(0.0, piece);
  std::this_thread::sleep_for(std::chrono::duration<double>(when(random)));
  child.kill();
  return piece;
}

KillReport kill_repeatedly(const std::vector<std::string>& argv, int lines, int kills,
                           std::uint64_t seed, const std::function<void()>& check) {
  std::mt19937_64 random(seed);
  KillReport report;
  std::vector<double> pieces;
  for (; report.kills < kills; ++report.kills) {
    pieces.push_back(kill_at_random_moment(argv, lines, random));
    try {
      check();
      report.survived += 1;
    } catch (const std::exception& e) {
      if (report.failure.empty()) report.failure = e.what();
    }
  }
  std::sort(pieces.begin(), pieces.end());
  if (!pieces.empty()) {
    const std::size_t n = pieces.size();
    report.piece_seconds = n % 2 == 1 ? pieces[n / 2] : (pieces[n / 2 - 1] + pieces[n / 2]) / 2;
  }
  return report;
}

}  // namespace lesson13
