// Tests of lesson 04: the device-mismatch error, its HINT and its fix.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include <cstdlib>

#include "common/child_process.h"  // defines: ChildProcess, self_executable, describe_status
#include "cuda_test.h"
#include "mismatch_error.cpp"
#include "scratch_files.h"

namespace {
void expect_error_then_fix(const torch::Device& model_device) {
  torch::manual_seed(lesson04::kSeed);
  lesson04::Classifier model = lesson04::make_model(model_device);
  ASSERT_EQ(lesson04::device_of(model), model_device);
  const auto mistake = lesson04::feed_cpu_batch(model);
  EXPECT_TRUE(mistake.threw);
  EXPECT_NE(mistake.message.find(lesson04::kMismatchText), std::string::npos) << mistake.message;
  EXPECT_EQ(mistake.message.find('\n'), std::string::npos);  // no backtrace
  EXPECT_NE(course::hint_for(mistake.message).find(".to(device)"), std::string::npos);
  const auto fixed = lesson04::feed_moved_batch(model);
  ASSERT_FALSE(fixed.threw) << fixed.message;
  EXPECT_EQ(fixed.output.sizes(), torch::IntArrayRef({lesson04::kBatch, lesson04::kClasses}));
  EXPECT_EQ(fixed.output.device(), model_device);
}
}  // namespace

// Tests the tutorial's golden rule on the CPU: as in the tutorial, nothing to demonstrate.
TEST(GoldenRule, SkippedOnTheCpu) {
  const auto rule = lesson04::golden_rule(torch::kCPU);
  EXPECT_FALSE(rule.demonstrated);
  EXPECT_TRUE(rule.error.empty());
}

// Tests the tutorial's golden rule with the meta device in the GPU's place: LibTorch's own
// mismatch message, without a backtrace, then the sum on the device after the fix.
TEST(GoldenRule, MismatchThenFixOnMeta) {
  const auto rule = lesson04::golden_rule(torch::Device(torch::kMeta));
  EXPECT_TRUE(rule.demonstrated);
  EXPECT_NE(rule.error.find(lesson04::kMismatchText), std::string::npos) << rule.error;
  EXPECT_EQ(rule.error.find("Exception raised from"), std::string::npos);  // no backtrace
  ASSERT_TRUE(rule.result.defined());
  EXPECT_TRUE(rule.result.is_meta());
  EXPECT_EQ(rule.result.sizes(), torch::IntArrayRef({3, 4}));
}

// Tests that without a GPU the lesson demonstrates on the meta device.
TEST(ModelDevice, MetaWithoutGpu) {
  EXPECT_TRUE(lesson04::model_device_for(torch::kCPU).is_meta());
}

// Tests the real error and the fix with a model on the meta device (any machine).
TEST(Mismatch, MetaModelCpuBatch) { expect_error_then_fix(torch::Device(torch::kMeta)); }

// Tests that a mismatch error the lesson raises gets the course's HINT, and that an error of
// another kind does not.
TEST(Hint, OnlyForMismatch) {
  EXPECT_EQ(course::hint_for("shape '[2]' is invalid").find(".to(device)"), std::string::npos);
  EXPECT_NE(course::hint_for(lesson04::kMismatchText).find(".to(device)"), std::string::npos);
}

namespace {
const torch::Device kMeta(torch::kMeta);

// A mistake that raised the mismatch error, with the course's HINT naming `fix`, and its fix,
// which ran with its result on `device`.
void expect_mismatch_then_fix(const lesson04::Attempt& mistake, const lesson04::Attempt& fixed,
                              const torch::Device& device, const char* fix) {
  EXPECT_TRUE(mistake.threw);
  EXPECT_NE(mistake.message.find(lesson04::kMismatchText), std::string::npos) << mistake.message;
  EXPECT_NE(course::hint_for(mistake.message).find(fix), std::string::npos) << mistake.message;
  ASSERT_FALSE(fixed.threw) << fixed.message;
  EXPECT_EQ(fixed.output.device(), device);
}

// The model's outputs on `device`, and labels on the host.
torch::Tensor outputs_on(const torch::Device& device) {
  return torch::randn({lesson04::kBatch, lesson04::kClasses}).to(device);
}
torch::Tensor host_labels() { return torch::randint(lesson04::kClasses, {lesson04::kBatch}); }
}  // namespace

// Tests mistake 1 with the meta device in the GPU's place: the model left on the host raises
// the mismatch error (the model's first op, x - mean, checks devices); built on meta, it runs.
TEST(Mistakes, ModelLeftOnHostOnMeta) {
  expect_mismatch_then_fix(lesson04::model_left_on_host(kMeta), lesson04::model_moved(kMeta), kMeta,
                           "model->to(device)");
}

// Tests what the meta device cannot stand in for, as the lesson's page says: a matrix product
// (linear, mm, addmm, what nn::Linear computes) of a host input and a meta weight, and the loss
// of meta outputs and host labels (mistake 2), raise nothing and return meta tensors.
TEST(Mistakes, MetaMissesMatrixProductsAndTheLoss) {
  const torch::Tensor x = torch::randn({lesson04::kBatch, lesson04::kFeatures});
  const torch::Tensor weight = torch::randn({lesson04::kClasses, lesson04::kFeatures}, kMeta);
  const torch::Tensor bias = torch::zeros({lesson04::kClasses}, kMeta);
  EXPECT_TRUE(torch::linear(x, weight, bias).is_meta());
  EXPECT_TRUE(torch::mm(x, weight.t()).is_meta());
  EXPECT_TRUE(torch::addmm(bias, x, weight.t()).is_meta());
  const lesson04::Attempt loss = lesson04::loss_of(outputs_on(kMeta), host_labels());
  ASSERT_FALSE(loss.threw) << loss.message;
  EXPECT_TRUE(loss.output.is_meta());
  const lesson04::Attempt fixed = lesson04::loss_of(outputs_on(kMeta), host_labels().to(kMeta));
  ASSERT_FALSE(fixed.threw) << fixed.message;
  EXPECT_TRUE(fixed.output.is_meta());
}

// Tests mistake 3 with the meta device in the GPU's place: predictions on meta compared with
// host labels raise the mismatch error; with the labels moved, the count runs.
TEST(Mistakes, PredictionsAgainstHostLabelsOnMeta) {
  const torch::Tensor outputs = outputs_on(kMeta);
  const torch::Tensor labels = host_labels();
  expect_mismatch_then_fix(lesson04::correct_of(outputs, labels),
                           lesson04::correct_of(outputs, labels.to(kMeta)), kMeta, "labels");
}

// Tests mistake 4 where it really happens, on a LibTorch or a machine without CUDA: .cuda()
// raises (Debian's 1.13: "PyTorch is not linked with support for cuda devices"), the HINT names
// .to(device), and the fix, the device chosen once, runs on the CPU.
TEST(Mistakes, CudaWithoutCuda) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "needs a machine without CUDA";
  const lesson04::Attempt mistake = lesson04::cuda_everywhere();
  ASSERT_TRUE(mistake.threw);
  EXPECT_EQ(mistake.message.find('\n'), std::string::npos);  // no backtrace
  EXPECT_NE(course::hint_for(mistake.message).find(".to(device)"), std::string::npos)
      << mistake.message;
  const lesson04::Attempt fixed = lesson04::to_device();
  ASSERT_FALSE(fixed.threw) << fixed.message;
  EXPECT_TRUE(fixed.output.is_cpu());
}

// Tests mistakes 1 to 3 on a GPU: each raises the mismatch error (cuda:0 and cpu), the loss of
// mistake 2 included, which the meta device cannot show; each fix runs on the GPU.
TEST_F(CudaTest, MistakesOneToThree) {
  expect_mismatch_then_fix(lesson04::model_left_on_host(device), lesson04::model_moved(device),
                           device, "model->to(device)");
  const torch::Tensor outputs = outputs_on(device);
  const torch::Tensor labels = host_labels();
  expect_mismatch_then_fix(lesson04::loss_of(outputs, labels),
                           lesson04::loss_of(outputs, labels.to(device)), device, "labels");
  expect_mismatch_then_fix(lesson04::correct_of(outputs, labels),
                           lesson04::correct_of(outputs, labels.to(device)), device, "labels");
}

// Tests mistake 4 on a GPU: there .cuda() runs, and so does its portable form, .to(device).
TEST_F(CudaTest, CudaRunsWhereThereIsCuda) {
  const lesson04::Attempt cuda = lesson04::cuda_everywhere();
  ASSERT_FALSE(cuda.threw) << cuda.message;
  EXPECT_TRUE(cuda.output.is_cuda());
  EXPECT_TRUE(lesson04::to_device().output.is_cuda());
}

// Tests mistake 5 where it happens: a file saved on the GPU goes back to the GPU when loaded
// here without a device; a process that sees no GPU (this test binary again, with
// CUDA_VISIBLE_DEVICES empty, running CheckpointWithoutGpu) cannot load it without a device,
// and loads it onto the CPU when the device is named.
TEST_F(CudaTest, CheckpointSavedOnGpuLoadedWithoutOne) {
  Scratch scratch;
  const std::string path = scratch.file("saved_on_gpu.pt");
  lesson04::save_on(device, path);
  const lesson04::Attempt back = lesson04::load_without_device(path);
  ASSERT_FALSE(back.threw) << back.message;
  EXPECT_EQ(back.output.device(), device);
  course::ChildProcess child({course::self_executable(), "--gtest_filter=CheckpointWithoutGpu.*"},
                             {"CUDA_VISIBLE_DEVICES=", "GPU_LESSONS_GPU_CHECKPOINT=" + path},
                             /*with_stderr=*/true);
  std::string output;
  for (const std::string& line : child.read_rest()) output += line + "\n";
  const std::optional<int> status = child.wait_for(std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << output;
  EXPECT_EQ(course::describe_status(*status), "exit 0") << output;
  EXPECT_NE(output.find("[  PASSED  ] 1 test"), std::string::npos) << output;  // not skipped
  std::cout << output;  // LibTorch's message, as the child printed it
}

// The child of the test above (skipped when run otherwise): the file named by
// GPU_LESSONS_GPU_CHECKPOINT, saved on a GPU, fails to load without a device here, with the
// course's HINT naming map_location; loaded onto the CPU, it lands there.
TEST(CheckpointWithoutGpu, FailsThenLoadsOntoTheCpu) {
  const char* path = std::getenv("GPU_LESSONS_GPU_CHECKPOINT");
  if (path == nullptr) GTEST_SKIP() << "run by CudaTest.CheckpointSavedOnGpuLoadedWithoutOne";
  const lesson04::Attempt mistake = lesson04::load_without_device(path);
  ASSERT_TRUE(mistake.threw) << "loaded onto " << mistake.output.device();
  std::cout << "error: " << mistake.message << "\n";
  EXPECT_NE(course::hint_for(mistake.message).find("map_location"), std::string::npos)
      << mistake.message;
  const lesson04::Attempt fixed = lesson04::load_onto(path, torch::kCPU);
  ASSERT_FALSE(fixed.threw) << fixed.message;
  EXPECT_TRUE(fixed.output.is_cpu());
}

// Tests the classic case on a GPU: a model on CUDA fed a CPU batch.
TEST_F(CudaTest, CudaModelCpuBatch) {
  const auto rule = lesson04::golden_rule(device);
  EXPECT_NE(rule.error.find(lesson04::kMismatchText), std::string::npos) << rule.error;
  EXPECT_TRUE(rule.result.is_cuda());
  EXPECT_EQ(lesson04::model_device_for(device), device);
  expect_error_then_fix(device);
}
