// cuda_test.h defines: CudaTest, the fixture of every test that needs a GPU (skipped without).
#pragma once

#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  }
  const c10::Device device{c10::kCUDA, 0};
};
