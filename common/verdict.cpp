// verdict.cpp: verdict line, exit codes and error printing shared by every lesson.
#include "common/verdict.h"

#include "common/interrupt.h"

#include <iostream>

#include <c10/util/Exception.h>  // defines: c10::Error::what_without_backtrace

namespace course {

std::string error_message(const std::exception& error) {
  std::string text = error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    text = c10_error->what_without_backtrace();
  }
  const auto newline = text.find('\n');
  return newline == std::string::npos ? text : text.substr(0, newline);
}

void print_error(const std::string& message, const std::string& hint) {
  std::cout.flush();
  std::cerr << "error: " << message << "\n";
  if (!hint.empty()) std::cerr << "HINT: " << hint << "\n";
}

bool Verdict::check(bool ok, const std::string& claim, const std::string& evidence) {
  ++checks_;
  if (!ok) ++failed_;
  std::cout << (ok ? "  [ok]   " : "  [FAIL] ") << claim;
  if (!evidence.empty()) std::cout << " (" << evidence << ")";
  std::cout << "\n";
  return ok;
}

void Verdict::waive(const std::string& reason) { waived_ = reason; }

int Verdict::finish(const std::string& summary) const {
  const std::string counts =
      std::to_string(checks_ - failed_) + "/" + std::to_string(checks_) + " checks passed";
  if (failed_ > 0) {
    std::cout << "RESULT: FAIL " << summary << " (" << counts << ")" << std::endl;
    return kExitFail;
  }
  if (!waived_.empty()) {
    std::cout << "RESULT: WAIVED " << waived_ << " (" << counts << ")" << std::endl;
    return kExitWaived;
  }
  std::cout << "RESULT: PASS " << summary << " (" << counts << ")" << std::endl;
  return kExitPass;
}

int run_lesson(int (*lesson_main)(int, char**), int argc, char** argv) {
  try {
    return lesson_main(argc, argv);
  } catch (const Interrupted& stop) {
    std::cout << "stopped (Ctrl-C): " << stop.what() << std::endl;
    return kExitInterrupted;
  } catch (const CourseError& error) {
    print_error(error.what(), error.hint());
    return kExitUsage;
  } catch (const std::exception& error) {
    print_error(error_message(error), "this is a bug in the lesson or in LibTorch; please report "
                                      "it with the full output above");
    std::cout << "RESULT: FAIL unexpected error" << std::endl;
    return kExitFail;
  }
}

}  // namespace course
