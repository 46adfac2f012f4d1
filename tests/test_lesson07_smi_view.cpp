// Tests of lesson 07's view of the GPU as nvidia-smi sees it
// (lessons/07_memory_management/smi_view.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "common/device.h"  // defines: cuda_device_count
#include "smi_view.h"

// Tests that nvidia-smi's view needs a CUDA device, and says why it has nothing without one: the
// library behind it is loaded at run time, so asking for it on a machine without the NVIDIA driver
// is an answer, not a crash.
TEST(SmiView, NeedsACudaDevice) {
  const lesson07::SmiView cpu = lesson07::smi_view(c10::Device(c10::kCPU));
  EXPECT_FALSE(cpu.available);
  EXPECT_NE(cpu.why_not.find("needs CUDA"), std::string::npos);
  if (course::cuda_device_count() == 0) {
    const lesson07::SmiView cuda = lesson07::smi_view(c10::Device(c10::kCUDA, 0));
    EXPECT_FALSE(cuda.available);
    EXPECT_NE(cuda.why_not.find("needs CUDA"), std::string::npos) << cuda.why_not;
  }
}

// Tests the watch on a device with no view: one line saying why, then nothing more, and the
// watch stops at once when it goes out of scope (no wait for the next period).
TEST(SmiWatch, OneLineWhereThereIsNothingToWatch) {
  std::ostringstream out;
  const auto start = std::chrono::steady_clock::now();
  {
    const lesson07::SmiWatch watch(c10::Device(c10::kCPU), std::chrono::hours(1), out);
    while (watch.lines() == 0 &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(watch.lines(), 1);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::minutes(1));  // not an hour
  const std::string text = out.str();
  EXPECT_EQ(text.rfind("  [nvidia-smi] nothing to watch: ", 0), 0u) << text;
  EXPECT_NE(text.find("needs CUDA"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}
