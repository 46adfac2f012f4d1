// Tests of common/verdict.h: the verdict and its exit codes, error messages, the HINTs for a
// learner's mistakes, report_error().

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/interrupt.h"
#include "common/verdict.h"
// Tests that the verdict's exit code agrees with its checks: pass 0, any failure 1, waived 77.
TEST(Verdict, ExitCodesAgree) {
  course::Verdict pass;
  pass.check(true, "a true claim");
  EXPECT_EQ(pass.finish("test"), course::kExitPass);

  course::Verdict fail;
  fail.check(true, "a true claim");
  fail.check(false, "a false claim");
  EXPECT_FALSE(fail.passed());
  EXPECT_EQ(fail.finish("test"), course::kExitFail);

  course::Verdict waived;
  waived.check(true, "a true claim");
  waived.waive("needs 2 GPUs");
  EXPECT_EQ(waived.finish("test"), course::kExitWaived);

  course::Verdict failed_and_waived;
  failed_and_waived.check(false, "a false claim");
  failed_and_waived.waive("needs 2 GPUs");
  EXPECT_EQ(failed_and_waived.finish("test"), course::kExitFail);
}

// Tests that LibTorch errors lose their backtrace and keep their first line.
TEST(ErrorMessage, DropsBacktrace) {
  try {
    torch::ones({2}) + torch::ones({3});
    FAIL() << "no error";
  } catch (const c10::Error& error) {
    const std::string message = course::error_message(error);
    EXPECT_EQ(message.find('\n'), std::string::npos);
    EXPECT_NE(message.find("must match the size"), std::string::npos) << message;
  }
}

// A lesson's main as every lesson writes it: `int main(...) try { ... } catch (...) { return
// course::report_error(); }`.
static int lesson_main_guarded(int (*body)(int, char**), int argc, char** argv) try {
  return body(argc, argv);
} catch (...) {
  return course::report_error();
}

// Tests that report_error(), in a lesson's catch block, turns Interrupted into its message and
// exit code 130.
TEST(StopOnInterrupt, ReportErrorExits130) {
  testing::internal::CaptureStdout();
  const int code = lesson_main_guarded(
      [](int, char**) -> int { throw course::Interrupted("epoch 2 abandoned"); }, 0, nullptr);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, course::kExitInterrupted);
  EXPECT_NE(out.find("stopped (Ctrl-C): epoch 2 abandoned"), std::string::npos) << out;
}

// Tests the HINTs for a learner's mistakes, with the errors LibTorch really raises where the CPU
// can raise them: tensors on two devices (the meta device stands in for a GPU), and a view
// detached in place. Anything else is still reported as a bug.
TEST(Hints, NameTheLearnersMistake) {
  std::string mismatch;
  try {
    (void)torch::add(torch::ones({2, 2}), torch::ones({2, 2}, torch::Device(torch::kMeta)));
  } catch (const std::exception& e) {
    mismatch = course::error_message(e);
  }
  ASSERT_FALSE(mismatch.empty()) << "LibTorch added a CPU tensor to a meta one";
  EXPECT_NE(course::hint_for(mismatch).find("different devices"), std::string::npos) << mismatch;
  std::string views;
  try {
    const torch::Tensor base = torch::ones({4}, torch::requires_grad());
    torch::Tensor view = base.slice(0, 0, 2);
    view.detach_();
  } catch (const std::exception& e) {
    views = course::error_message(e);
  }
  if (views.empty()) views = "Can't detach views in-place. Use detach() instead.";  // 2.x allows it
  EXPECT_NE(course::hint_for(views).find("flat"), std::string::npos) << views;
  EXPECT_NE(course::hint_for("lab 05.2 is not done: move the model").find("grade-lab"),
            std::string::npos);
  EXPECT_NE(course::hint_for("CUDA out of memory. Tried to allocate 2.00 GiB").find("lesson 07"),
            std::string::npos);
  EXPECT_NE(course::hint_for("std::bad_function_call").find("bug"), std::string::npos);
}

// Tests the HINTs for the mistakes lesson 04 shows, with the messages LibTorch really printed
// for them (error_message's first line; where that line is long, its first sentence): the
// mismatch of a model, labels or predictions left on the CPU, and CUDA asked for where there is
// none, by .cuda() or by a file saved on a GPU loaded without a device. On this machine, when it
// has no CUDA, .cuda() is also run, and its message given the same HINT.
TEST(Hints, NameEachOfLessonFoursMistakes) {
  const auto names = [](const std::string& message, const char* fix) {
    return course::hint_for(message).find(fix) != std::string::npos;
  };
  // A model, labels or predictions on the meta device (a GPU's stand-in) meet a CPU tensor
  // (LibTorch 1.13 and 2.11 alike); on a GPU the devices are cuda:0 and cpu.
  const std::string mismatch =
      "Expected all tensors to be on the same device, but found at least two devices, meta and "
      "cpu!";
  EXPECT_TRUE(names(mismatch, "model->to(device)"));
  EXPECT_TRUE(names(mismatch, "labels"));
  // .cuda() or .to(torch::kCUDA): Debian's LibTorch 1.13 (built without CUDA), then 2.11 (built
  // with CUDA) on a machine without a GPU.
  const std::vector<std::string> no_cuda = {
      "PyTorch is not linked with support for cuda devices",
      "CUDA error: CUDA driver version is insufficient for CUDA runtime version",
      // torch::randn(..., torch::kCUDA): 1.13, then 2.11 without a GPU.
      "Could not run 'aten::empty.memory_format' with arguments from the 'CUDA' backend. This "
      "could be because the operator doesn't exist for this backend, or was omitted during the "
      "selective/custom build process (if using custom build).",
      "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
      "installed a driver from http://www.nvidia.com/Download/index.aspx",
      // The same load by 2.11 on a GPU machine whose GPUs CUDA_VISIBLE_DEVICES hides (H200).
      "No CUDA GPUs are available",
      // torch::load(model, path) of a file saved on a GPU, no device named: 1.13 (2.11 without
      // a GPU says "Found no NVIDIA driver", above).
      "Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend. This could be "
      "because the operator doesn't exist for this backend, or was omitted during the "
      "selective/custom build process (if using custom build).",
  };
  for (const std::string& message : no_cuda) {
    EXPECT_TRUE(names(message, ".to(device)")) << message;
    EXPECT_TRUE(names(message, "map_location")) << message;
    EXPECT_TRUE(names(message, "lesson 04")) << message;
  }
  if (!torch::cuda::is_available()) {
    std::string message;
    try {
      (void)torch::ones({2}).cuda();
    } catch (const std::exception& e) {
      message = course::error_message(e);
    }
    ASSERT_FALSE(message.empty()) << ".cuda() ran on a machine without CUDA";
    EXPECT_TRUE(names(message, ".to(device)")) << message;
  }
}

// Tests that report_error() prints a lab TODO's throw with its HINT and ends with RESULT: FAIL.
TEST(Hints, ReportErrorNamesALabTodo) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = lesson_main_guarded(
      [](int, char**) -> int {
        throw std::logic_error("lab 02.1 is not done: move every parameter");
      },
      0, nullptr);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, course::kExitFail);
  EXPECT_NE(err.find("error: lab 02.1 is not done"), std::string::npos) << err;
  EXPECT_NE(err.find("HINT: a lab TODO is still to do"), std::string::npos) << err;
  EXPECT_NE(out.find("RESULT: FAIL"), std::string::npos) << out;
}
