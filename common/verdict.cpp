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

std::string hint_for(const std::string& message) {
  const auto has = [&](const char* text) { return message.find(text) != std::string::npos; };
  if (has("is not done: ")) {  // the throw a lab's TODO stands in for (scripts/make-labs)
    return "a lab TODO is still to do: write what its comment asks for, then grade the lab "
           "(scripts/grade-lab NN)";
  }
  if (has("Expected all tensors to be on the same device") || has("is not on the expected device") ||
      has("to have the same device as")) {
    return "two tensors in one operation are on different devices: a batch left on the CPU "
           "(move it with .to(device), where the model is), or an optimizer built before "
           "model->to(device) (build it after the move); lesson 04 shows this error and its fix";
  }
  if (has("Can't detach views in-place")) {
    return "zero_grad() was called on parameters whose gradients are views into one flat tensor "
           "(lesson 05's flat step): zero the flat gradient tensor instead, or do not flatten";
  }
  if (has("out of memory")) {
    return "the device ran out of memory: a smaller --batch-size, or see lesson 07 (what "
           "the allocator holds, and how a run survives running out)";
  }
  return "this is a bug in the lesson or in LibTorch; please report it with the full output above";
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
  } catch (...) {
    return report_error();
  }
}

int report_error() {
  try {
    throw;
  } catch (const Interrupted& stop) {
    std::cout << "stopped (Ctrl-C): " << stop.what() << std::endl;
    return kExitInterrupted;
  } catch (const CourseError& error) {
    print_error(error.what(), error.hint());
    return kExitUsage;
  } catch (const std::exception& error) {
    const std::string message = error_message(error);
    print_error(message, hint_for(message));
    std::cout << "RESULT: FAIL stopped by the error above" << std::endl;
    return kExitFail;
  } catch (...) {
    print_error("an exception that is not a std::exception", hint_for(""));
    std::cout << "RESULT: FAIL stopped by the error above" << std::endl;
    return kExitFail;
  }
}

}  // namespace course
