// verdict.cpp: verdict line, exit codes and error printing shared by every lesson.
#include "common/verdict.h"

#include <c10/util/Exception.h>  // defines: c10::Error::what_without_backtrace

#include <iostream>

#include "common/interrupt.h"

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
  if (has("Expected all tensors to be on the same device") ||
      has("is not on the expected device") || has("to have the same device as")) {
    return "two tensors in one operation are on different devices: the model left on the CPU "
           "(model->to(device), once, right after building it), a batch or its labels left on "
           "the CPU (move both with .to(device) in the loop), predictions compared with labels "
           "on the CPU (move the labels), or an optimizer built before model->to(device) (build "
           "it after the move); lesson 04 shows the first three and their fixes";
  }
  // CUDA asked for where there is none. A CPU-only LibTorch (Debian's 1.13) says "not linked"
  // for .cuda() and "Could not run '...' with arguments from the 'CUDA' backend" for a tensor
  // made there (torch::load of a file saved on a GPU makes its tensors with aten::empty_strided);
  // a LibTorch with CUDA on a machine without a GPU or driver fails in the CUDA runtime, and
  // says "No CUDA GPUs are available" where the driver is there but CUDA_VISIBLE_DEVICES hides
  // every GPU (2.11, seen loading a file saved on an H200).
  if (has("not linked with support for cuda") || has("from the 'CUDA' backend") ||
      has("Found no NVIDIA driver") || has("CUDA driver version is insufficient") ||
      has("no CUDA-capable device is detected") || has("No CUDA GPUs are available")) {
    return "this LibTorch or this machine has no CUDA, and the program asked for it: a .cuda() "
           "or .to(torch::kCUDA) (choose the device once, torch::cuda::is_available() ? "
           "torch::kCUDA : torch::kCPU, and write .to(device) everywhere), or a file saved on a "
           "GPU loaded without a device (name one: torch::load(model, path, device), Python's "
           "map_location); lesson 04's mistakes 4 and 5";
  }
  if (has("Can't detach views in-place")) {
    return "zero_grad() was called on parameters whose gradients are views into one flat tensor "
           "(lesson 12's flat step): zero the flat gradient tensor instead, or do not flatten";
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
