// Tests of lesson 02: model->to(device) moves parameters and buffers in place.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "move_asked.h"
#include "moving_model.cpp"

namespace {
int count_buffers(const std::vector<lesson02::Placement>& rows) {
  int n = 0;
  for (const auto& row : rows) n += row.is_buffer;
  return n;
}
}  // namespace

// Tests the tutorial's model: SimpleNN's layers under the tutorial's names, and every parameter
// on the device after the move.
TEST(Tutorial, SimpleNNMovesEveryParameter) {
  lesson02::SimpleNN model = lesson02::tutorial_model(torch::kCPU);
  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].key(), "fc1.weight");
  EXPECT_EQ(params[0].value().sizes(), torch::IntArrayRef({10, 3}));
  EXPECT_EQ(params[3].key(), "fc2.bias");
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.device().is_cpu());
  EXPECT_EQ(model->forward(torch::randn({100, 3})).sizes(), torch::IntArrayRef({100, 2}));
}

// Tests that the tutorial's model is moved to the device it is given (move_asked.h).
TEST(Tutorial, AsksForTheMove) {
  expect_move_asked([](const c10::Device& device) { lesson02::tutorial_model(device); },
                    "tutorial_model");
}

// Tests that the inventory lists BatchNorm's buffers as well as the parameters.
TEST(Inventory, ListsParametersAndBuffers) {
  lesson02::Net model;
  const auto rows = lesson02::inventory(*model);
  EXPECT_EQ(rows.size(), 9u);
  EXPECT_EQ(count_buffers(rows), 3);  // running_mean, running_var, num_batches_tracked
}

// Tests that moving to the CPU keeps everything in place and copies nothing.
TEST(MoveModel, ToCpuIsInPlaceWithoutCopy) {
  lesson02::Net model;
  const auto report = lesson02::move_model(model, torch::kCPU);
  EXPECT_TRUE(report.all_on_device);
  EXPECT_TRUE(report.same_objects);
  EXPECT_FALSE(report.storage_changed);
  const std::int64_t expected = (lesson02::kInputs + 1) * lesson02::kHidden * 4 +
                                (lesson02::kHidden + 1) * lesson02::kClasses * 4 +
                                4 * lesson02::kHidden * 4 + 8;
  EXPECT_EQ(report.bytes, expected);
}

// Tests that the optimizer built after the move holds the model's own tensors and steps.
TEST(Optimizer, BuiltAfterMoveHoldsModelTensors) {
  torch::manual_seed(lesson02::kSeed);
  lesson02::Net model;
  lesson02::move_model(model, torch::kCPU);
  auto optimizer = lesson02::make_optimizer(model);
  EXPECT_TRUE(lesson02::optimizer_matches_model(optimizer, model, torch::kCPU));
  const torch::Tensor before = model->fc1->weight.clone();
  EXPECT_TRUE(std::isfinite(lesson02::train_step(model, optimizer, torch::kCPU)));
  EXPECT_FALSE(torch::equal(before, model->fc1->weight));  // the step changed the weights
}

// Tests that move_model asks for the move, where a CPU-only machine can tell (move_asked.h).
TEST(MoveModel, AsksForTheMove) {
  expect_move_asked(
      [](const c10::Device& device) {
        lesson02::Net model;
        lesson02::move_model(model, device);
      },
      "move_model");
}

// Tests what the lesson says of new tensors: on the CPU unless a device is named (the meta device
// stands in for a GPU: a plain tensor can go there).
TEST(NewTensors, OnTheCpuUnlessTheDeviceIsNamed) {
  const torch::Device meta(torch::kMeta);
  const lesson02::NewTensors where = lesson02::where_new_tensors_go(meta);
  EXPECT_EQ(where.plain, torch::Device(torch::kCPU));
  EXPECT_EQ(where.told, meta);
  EXPECT_EQ(where.moved, meta);
}

// Tests that to(kFloat64) converts every parameter.
TEST(MoveModel, ToDtypeConvertsParameters) {
  lesson02::Net model;
  model->to(torch::kFloat64);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat64);
}

// Tests that moving to the GPU moves every tensor to new memory, in place, and outputs match.
TEST_F(CudaTest, MoveToGpu) {
  for (const auto& p : lesson02::tutorial_model(device)->parameters()) EXPECT_TRUE(p.is_cuda());
  torch::manual_seed(lesson02::kSeed);
  lesson02::Net model;
  model->eval();
  const torch::Tensor x = torch::randn({lesson02::kBatch, lesson02::kInputs});
  const torch::Tensor cpu_out = model->forward(x);
  const torch::Tensor weight = model->fc1->weight;
  const auto report = lesson02::move_model(model, device);
  EXPECT_TRUE(report.all_on_device);
  EXPECT_TRUE(report.same_objects);
  EXPECT_TRUE(report.storage_changed);
  EXPECT_EQ(weight.device(), device);
  const torch::Tensor gpu_out = model->forward(x.to(device)).cpu();
  EXPECT_LE(course::max_rel_diff(gpu_out, cpu_out), lesson02::kOutputTolerance);
  auto optimizer = lesson02::make_optimizer(model);
  EXPECT_TRUE(lesson02::optimizer_matches_model(optimizer, model, device));
}
