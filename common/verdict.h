// verdict.h defines: exit codes, the errors that end a lesson with a HINT, the checked verdict
// every lesson ends with, and report_error() (the catch block around each lesson's main).
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace course {

// Exit codes, the same in every lesson (CTest treats 77 as "skipped").
constexpr int kExitPass = 0;
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;
constexpr int kExitWaived = 77;

/// An error the user fixes (a flag, a package, a file): printed with its HINT, exit 2.
class CourseError : public std::runtime_error {
 public:
  CourseError(const std::string& what, std::string hint)
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

/// A bad flag or flag value.
class UsageError : public CourseError {
 public:
  using CourseError::CourseError;
};

/// The first line of an exception's message, without LibTorch's C++ backtrace.
std::string error_message(const std::exception& error);

/// The HINT for an error that is not a CourseError, from its message: the mistakes a learner
/// makes (a lab TODO still to do, tensors on two devices, CUDA asked for where there is none (a
/// .cuda(), a file saved on a GPU loaded without a device), an optimizer or a model changed under
/// the other, memory run out) get a HINT that names them; anything else is reported as a bug.
std::string hint_for(const std::string& message);

/// Prints "error: <message>" and "HINT: <hint>" to stderr.
void print_error(const std::string& message, const std::string& hint);

/// Collects the claims a lesson checks and prints the one verdict line.
class Verdict {
 public:
  /// Records a claim: prints "  [ok] claim (evidence)" or "  [FAIL] claim (evidence)".
  bool check(bool ok, const std::string& claim, const std::string& evidence = "");
  /// Marks the lesson waived (it needs hardware this machine lacks), unless a check failed.
  void waive(const std::string& reason);
  bool passed() const { return failed_ == 0; }
  int checks() const { return checks_; }
  /// Prints "RESULT: PASS|FAIL|WAIVED <summary>" and returns the exit code that agrees.
  int finish(const std::string& summary) const;

 private:
  int checks_ = 0;
  int failed_ = 0;
  std::string waived_;
};

/// Called in a catch block (a lesson's `int main(...) try { ... } catch (...)`): reports the
/// error being handled and returns the exit code that agrees (2 for a CourseError with its HINT,
/// 130 for Ctrl-C, 1 with "RESULT: FAIL" for any other error).
int report_error();

}  // namespace course
