// Tests of lesson 12: the flat parameters, the written-out backward against autograd, each form's
// training against the one before, the operators each step dispatches, and the accuracy.
#include <gtest/gtest.h>

#include <set>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/compare.h"
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "fewer_operators.cpp"

namespace {

// `n` random images, labels 0..9 in turn.
course::ImageSet random_images(std::int64_t n) {
  course::ImageSet data;
  data.images = torch::rand({n, 28, 28});
  data.labels = torch::arange(n, torch::kLong).remainder(10);
  return data;
}

// A dataset whose first pixel holds the sample's index and whose label is that index mod 10, so a
// batch says which samples it holds and whether each label came with its image.
course::ImageSet numbered(std::int64_t n) {
  course::ImageSet data = random_images(n);
  data.images.select(2, 0).select(1, 0).copy_(torch::arange(n, torch::kFloat));
  return data;
}

// The sample indices one epoch of `batches` yields, in order; each label checked against its image.
std::vector<std::int64_t> one_epoch(lesson12::ResidentBatches& batches) {
  std::vector<std::int64_t> seen;
  lesson12::Batch batch;
  batches.start_epoch();
  while (batches.next(batch)) {
    EXPECT_LE(batch.labels.size(0), 64);
    const torch::Tensor ids = batch.images.select(1, 0).to(torch::kCPU).to(torch::kLong);
    EXPECT_TRUE(torch::equal(ids.remainder(10), batch.labels.to(torch::kCPU)));
    for (std::int64_t i = 0; i < ids.size(0); ++i) seen.push_back(ids[i].item<std::int64_t>());
  }
  return seen;
}

// Every sample of 1000 exactly once.
void expect_every_sample_once(const std::vector<std::int64_t>& seen) {
  ASSERT_EQ(seen.size(), 1000u);
  EXPECT_EQ(std::set<std::int64_t>(seen.begin(), seen.end()).size(), 1000u);
}

double mean_loss(course::ANN& model, const course::ImageSet& data) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto device = model->parameters().front().device();
  return torch::nn::functional::cross_entropy(
             model->forward(data.images.reshape({-1, 784}).to(device)), data.labels.to(device))
      .item<double>();
}

}  // namespace

// Tests that the resident batches hold every sample once per epoch, each label with its image, in
// an order drawn anew each epoch, the last batch shorter.
TEST(ResidentBatches, EverySampleOncePerEpochReshuffled) {
  const course::ImageSet data = numbered(1000);
  torch::manual_seed(1);
  lesson12::ResidentBatches batches(data, 64, torch::kCPU);
  const auto first = one_epoch(batches);
  const auto second = one_epoch(batches);
  expect_every_sample_once(first);
  expect_every_sample_once(second);
  EXPECT_NE(first, second) << "each epoch must be shuffled anew";
}

// Tests what the lesson is for: each form dispatches fewer operators per step than the one
// before (counted on a step after the first), and the manual step's gradients equal the flat
// step's after the same first step.
TEST(OperatorCounts, EachFormDispatchesFewer) {
  const lesson12::OperatorCounts ops =
      lesson12::count_operators_per_step(random_images(64), 64, torch::kCPU, 1);
  EXPECT_EQ(ops.tensors, 6u);
  EXPECT_LT(ops.flat, ops.tutorial);
  EXPECT_LT(ops.manual, ops.flat);
  EXPECT_LE(ops.manual_vs_flat, course::tolerance_for(torch::kFloat));
}

// Tests that an unknown run name is a usage error.
TEST(Runs, UnknownNameIsUsageError) {
  EXPECT_THROW(lesson12::train_and_evaluate(random_images(10), random_images(10), "pinned", 1, 4,
                                            torch::kCPU, 1),
               course::UsageError);
}

// Tests that flattening keeps the values and routes every gradient into the flat buffer.
TEST(FlattenParameters, ParametersAndGradientsLiveInFlatBuffers) {
  torch::manual_seed(3);
  course::ANN model;
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  const lesson12::FlatParameters flat = lesson12::flatten_parameters(*model);
  EXPECT_EQ(flat.values.numel(), 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10);
  const auto* begin = flat.values.data_ptr<float>();
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i]));
    const auto* data = params[i].data_ptr<float>();
    EXPECT_TRUE(data >= begin && data < begin + flat.values.numel());
  }
  model->forward(torch::rand({8, 784})).sum().backward();
  EXPECT_GT(flat.gradients.abs().sum().item<double>(), 0.0);
  for (const auto& p : params) {
    EXPECT_TRUE(torch::equal(p.grad().reshape(-1),
                             flat.gradients.slice(0, p.data_ptr<float>() - begin,
                                                  p.data_ptr<float>() - begin + p.numel())));
  }
}

// Tests that the flat Adam step equals LibTorch's Adam over the separate parameters.
TEST(FlattenParameters, SameStepsAsPerParameterAdam) {
  auto run = [](bool flat) {
    torch::manual_seed(4);
    course::ANN model;
    lesson12::FlatParameters buffers;
    std::unique_ptr<torch::optim::Adam> adam;
    if (flat) {
      buffers = lesson12::flatten_parameters(*model);
      adam =
          std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{buffers.values},
                                               torch::optim::AdamOptions(lesson12::kLearningRate));
    } else {
      adam = std::make_unique<torch::optim::Adam>(
          model->parameters(), torch::optim::AdamOptions(lesson12::kLearningRate));
    }
    torch::manual_seed(5);
    for (int step = 0; step < 5; ++step) {
      if (flat)
        buffers.gradients.zero_();
      else
        adam->zero_grad();
      const torch::Tensor x = torch::rand({16, 784});
      const torch::Tensor y = torch::randint(10, {16});
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      adam->step();
    }
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  };
  const auto flat = run(true), separate = run(false);
  for (size_t i = 0; i < flat.size(); ++i) {
    EXPECT_LT(course::max_abs_diff(flat[i], separate[i]), 1e-6) << i;
  }
}

// ---- with Fashion-MNIST ------------------------------------------------------------------------
// Tests that one epoch on a fixed subset lowers the loss on that subset.
TEST_F(FashionMnistTest, OneEpochReducesLoss) {
  const course::ImageSet subset = course::take(train(), 5000);
  lesson12::FlatTrainer trainer = lesson12::make_flat_trainer(torch::kCPU, lesson12::kSeed);
  const double before = mean_loss(trainer.model, subset);
  lesson12::ResidentBatches batches(subset, lesson12::kBatchSize, torch::kCPU);
  const auto stats = lesson12::train_epoch_flat(trainer, batches, torch::kCPU);
  EXPECT_EQ(stats.samples, 5000);
  EXPECT_LT(mean_loss(trainer.model, subset), 0.6 * before);
}

// Tests the lesson's flat form: the flat parameters train as the tutorial's step does (Adam over
// model->parameters(), zero_grad()), epoch by epoch, from the same seed.
TEST_F(FashionMnistTest, FlatStepTrainsAsTheTutorialStep) {
  const course::ImageSet subset = course::take(train(), 3000);
  const course::ImageSet eval = course::take(test(), 1000);
  const auto tutorial =
      lesson12::train_and_evaluate(subset, eval, "resident", 2, 64, torch::kCPU, 7);
  const auto flat = lesson12::train_and_evaluate(subset, eval, "flat", 2, 64, torch::kCPU, 7);
  for (size_t e = 0; e < tutorial.epochs.size(); ++e) {
    EXPECT_LE(std::abs(flat.epochs[e].mean_loss - tutorial.epochs[e].mean_loss) /
                  tutorial.epochs[e].mean_loss,
              lesson12::kFlatTolerance);
  }
  EXPECT_NEAR(flat.accuracy, tutorial.accuracy, 0.01);
}

// Tests the manual step against autograd: from the same weights on the same batch, the gradients
// it writes into the flat tensor equal those loss.backward() accumulates there (fp32's tolerance,
// relative to the largest), and so does the loss.
TEST(ManualStep, SameGradientsAsAutograd) {
  torch::manual_seed(6);
  const lesson12::Batch batch{torch::rand({64, 784}), torch::randint(10, {64})};
  lesson12::FlatTrainer autograd = lesson12::make_flat_trainer(torch::kCPU, 3);
  lesson12::FlatTrainer manual = lesson12::make_flat_trainer(torch::kCPU, 3);
  autograd.flat.gradients.zero_();
  const torch::Tensor expected =
      torch::nn::functional::cross_entropy(autograd.model->forward(batch.images), batch.labels);
  expected.backward();
  const torch::Tensor before = manual.flat.values.clone();
  manual.flat.gradients.fill_(123);  // anything there is overwritten, not added to
  const torch::Tensor loss = lesson12::manual_step(manual, batch);
  const double scale = autograd.flat.gradients.abs().max().item<double>();
  EXPECT_LE(course::max_abs_diff(manual.flat.gradients, autograd.flat.gradients) / scale,
            course::tolerance_for(torch::kFloat));
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(),
              course::tolerance_for(torch::kFloat) * expected.item<double>());
  EXPECT_FALSE(torch::equal(manual.flat.values, before)) << "Adam took no step";
}

// Tests the lesson's manual form: it trains as the flat form does, epoch by epoch, from the same
// seed on the same batches.
TEST_F(FashionMnistTest, ManualStepTrainsAsTheFlatStep) {
  const course::ImageSet subset = course::take(train(), 3000);
  const course::ImageSet eval = course::take(test(), 1000);
  const auto flat = lesson12::train_and_evaluate(subset, eval, "flat", 2, 64, torch::kCPU, 7);
  const auto manual = lesson12::train_and_evaluate(subset, eval, "manual", 2, 64, torch::kCPU, 7);
  EXPECT_LE(course::max_loss_difference(manual.epochs, flat.epochs), lesson12::kFlatTolerance);
  EXPECT_NEAR(manual.accuracy, flat.accuracy, 0.01);
}

// Tests the mistake of mixing the two: zero_grad() on a flattened model's parameters leaves their
// gradients outside the flat tensor (2.x sets them to none), and the flat epoch says so instead of
// training on gradients Adam never sees.
TEST(FlattenParameters, ZeroGradOnAFlattenedModelIsACourseError) {
  lesson12::FlatTrainer trainer = lesson12::make_flat_trainer(torch::kCPU, 1);
  trainer.model->zero_grad(/*set_to_none=*/true);
  lesson12::ResidentBatches batches(random_images(100), 64, torch::kCPU);
  try {
    lesson12::train_epoch_flat(trainer, batches, torch::kCPU);
    ADD_FAILURE() << "trained with gradients outside the flat tensor";
  } catch (const course::CourseError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_grad()"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("flat.gradients.zero_()"), std::string::npos) << e.hint();
  }
}

// Tests the lesson's verdict: the default run of the fastest form (5 epochs, batch 64, all 60,000
// images) reaches the accuracy bar.
TEST_F(FashionMnistTest, DefaultRunReachesAccuracyBar) {
  const auto run = lesson12::train_and_evaluate(train(), test(), "manual", lesson12::kEpochs,
                                                lesson12::kBatchSize, torch::kCPU, lesson12::kSeed);
  EXPECT_GE(run.accuracy, lesson12::kAccuracyBar);
  EXPECT_LT(run.epochs.back().mean_loss, run.epochs.front().mean_loss);
}

// Tests the flat and manual forms on the GPU: they train (the loss falls) on the device's batches.
TEST_F(CudaTest, FlatAndManualTrainOnGpu) {
  {  // the batches on the GPU: every sample once per epoch, each label with its image
    lesson12::ResidentBatches batches(numbered(1000), 64, device);
    expect_every_sample_once(one_epoch(batches));
    expect_every_sample_once(one_epoch(batches));
  }
  const course::ImageSet data = random_images(2000);
  for (const std::string run : {"flat", "manual"}) {
    lesson12::FlatTrainer trainer = lesson12::make_flat_trainer(device, lesson12::kSeed);
    EXPECT_EQ(trainer.flat.values.device(), device);
    lesson12::ResidentBatches batches(data, 64, device);
    std::function<torch::Tensor(const lesson12::Batch&)> step;  // empty: the flat step
    if (run == "manual")
      step = [&](const lesson12::Batch& b) { return lesson12::manual_step(trainer, b); };
    const double first = lesson12::train_epoch_flat(trainer, batches, device, step).mean_loss;
    double last = first;
    for (int e = 0; e < 3; ++e)
      last = lesson12::train_epoch_flat(trainer, batches, device, step).mean_loss;
    EXPECT_LT(last, first) << run;
  }
}
