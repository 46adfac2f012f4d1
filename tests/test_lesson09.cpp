// Tests of lesson 09: DataParallel's steps against one model, the sharding of an epoch across
// ranks, the collectives on real c10d groups (Gloo ranks as threads of this process, meeting in a
// HashStore or a TCPStore), the rendezvous errors, and two ranks against one process with the
// global batch. The two-process runs (and a rank killed) are CTest tests of the binary itself.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <thread>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/device.h"
#include "common/verdict.h"
#include "data_parallel.h"
#include "fashion_mnist_test.h"

namespace {

using lesson09::shard_indices;

// Runs fn(rank) on `world` threads, each one rank, and rethrows the first failure.
void on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// A TCP port nobody listens on right now.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class GlooTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (lesson09::backend_for(torch::kCPU, &why).empty()) GTEST_SKIP() << why;
  }
  const std::chrono::milliseconds timeout{30000};
};

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// ---- part 1 ---------------------------------------------------------------------------------------
// Tests that a DataParallel step (replicas on CPU threads) gives one model's loss and gradients on
// the whole batch, leaves them on the master's parameters, and does not touch its values.
TEST(Lesson09DataParallel, MatchesOneModelOnTheWholeBatch) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    for (int replicas : {2, 3}) {  // 3 does not divide the batch: chunks of 34, 34, 32
      torch::nn::Sequential model = lesson09::make_model(1);
      model->to(dtype);
      torch::nn::Sequential reference =
          std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
      const std::vector<torch::Tensor> before = [&] {
        std::vector<torch::Tensor> v;
        for (const auto& p : model->parameters()) v.push_back(p.detach().clone());
        return v;
      }();
      torch::manual_seed(2);
      const torch::Tensor x = torch::randn({100, 784}, dtype);
      const torch::Tensor y = torch::randint(10, {100}, torch::kLong);
      const auto dp = lesson09::data_parallel_step(
          model, x, y, std::vector<torch::Device>(replicas, torch::kCPU));
      const auto one = lesson09::single_model_step(reference, x, y);
      const double tol = course::tolerance_for(dtype);
      EXPECT_LE(std::abs(dp.loss.item<double>() - one.loss.item<double>()), tol);
      EXPECT_LE(course::max_rel_diff(dp.gradients, one.gradients), tol);
      std::vector<torch::Tensor> grads, values;
      for (const auto& p : model->parameters()) {
        grads.push_back(p.grad());
        values.push_back(p.detach());
      }
      EXPECT_EQ(course::max_abs_diff(grads, dp.gradients), 0.0);
      EXPECT_EQ(course::max_abs_diff(values, before), 0.0);
      EXPECT_GT(dp.seconds.total(), 0.0);
    }
  }
}

// ---- sharding ----------------------------------------------------------------------------------
// Tests that across ranks and steps every sample of an epoch is taken exactly once, and that a
// global step's shards, in rank order, are one process's batch of world x batch.
TEST(Lesson09Sharding, EverySampleExactlyOncePerEpoch) {
  for (std::int64_t samples : {1000, 1003, 60000}) {
    for (int world : {1, 2, 3, 4}) {
      for (std::int64_t batch : {7, 64}) {
        const torch::Tensor order = lesson09::epoch_order(samples, 9, 0);
        const std::int64_t steps = lesson09::steps_per_epoch(samples, world, batch);
        std::vector<torch::Tensor> all;
        for (std::int64_t s = 0; s < steps; ++s) {
          std::vector<torch::Tensor> step;
          for (int r = 0; r < world; ++r) step.push_back(shard_indices(order, s, r, world, batch));
          const torch::Tensor together = torch::cat(step);
          const torch::Tensor one_process = shard_indices(order, s, 0, 1, world * batch);
          ASSERT_TRUE(torch::equal(together, one_process)) << samples << " " << world << " " << s;
          all.push_back(together);
        }
        EXPECT_TRUE(torch::equal(std::get<0>(torch::cat(all).sort()), torch::arange(samples)))
            << samples << " samples, world " << world << ", batch " << batch;
        // No step beyond the last one, and the last one is not empty.
        EXPECT_EQ(shard_indices(order, steps, 0, world, batch).numel(), 0);
        EXPECT_GT(shard_indices(order, steps - 1, 0, world, batch).numel(), 0);
      }
    }
  }
}

// Tests that the order depends on the seed and the epoch only: every rank draws the same one.
TEST(Lesson09Sharding, SameOrderOnEveryRankNewEachEpoch) {
  const torch::Tensor a = lesson09::epoch_order(500, 9, 3);
  torch::manual_seed(123);  // the global generator plays no part
  EXPECT_TRUE(torch::equal(a, lesson09::epoch_order(500, 9, 3)));
  EXPECT_FALSE(torch::equal(a, lesson09::epoch_order(500, 9, 4)));
  EXPECT_FALSE(torch::equal(a, lesson09::epoch_order(500, 10, 3)));
}

// ---- the environment ---------------------------------------------------------------------------
// Tests that a plain run is no job, and that torchrun's variables are read and checked.
TEST(Lesson09Environment, ReadsWhatTheLauncherSets) {
  {
    ScopedEnv world("WORLD_SIZE", nullptr);
    EXPECT_FALSE(lesson09::rank_from_environment().has_value());
  }
  ScopedEnv world("WORLD_SIZE", "4"), rank("RANK", "3"), local("LOCAL_RANK", "1"),
      local_world("LOCAL_WORLD_SIZE", "2"), addr("MASTER_ADDR", "10.1.2.3"),
      port("MASTER_PORT", "29999"), agent("TORCHELASTIC_USE_AGENT_STORE", "True"),
      restarts("TORCHELASTIC_RESTART_COUNT", "2");
  const auto info = lesson09::rank_from_environment();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 2);
  EXPECT_EQ(info->master_addr, "10.1.2.3");
  EXPECT_EQ(info->master_port, 29999);
  EXPECT_TRUE(info->agent_store);
  EXPECT_EQ(info->restart_count, 2);
}

// Tests that a missing RANK, or one past the world size, is a usage error naming the variable.
TEST(Lesson09Environment, BadValuesAreUsageErrors) {
  ScopedEnv world("WORLD_SIZE", "2");
  {
    ScopedEnv rank("RANK", nullptr);
    EXPECT_THROW(lesson09::rank_from_environment(), course::UsageError);
  }
  for (const char* bad : {"2", "-1", "one"}) {
    ScopedEnv rank("RANK", bad);
    try {
      lesson09::rank_from_environment();
      ADD_FAILURE() << "RANK=" << bad << " accepted";
    } catch (const course::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("RANK="), std::string::npos) << e.what();
    }
  }
}

// ---- which device each rank takes ------------------------------------------------------------------
lesson09::RankInfo local_rank_of(int local_rank, int local_world_size) {
  lesson09::RankInfo info;
  info.rank = info.local_rank = local_rank;
  info.world_size = info.local_world_size = local_world_size;
  return info;
}

// Tests the rule every rank applies: a GPU per rank when there are enough; one visible GPU per
// rank through CUDA_VISIBLE_DEVICES; too few GPUs: every rank on the CPU (auto) or a usage error
// (cuda), on every rank alike, so that no job mixes NCCL and Gloo ranks.
TEST(Lesson09RankDevice, OneRuleForEveryRank) {
  using lesson09::rank_device;
  // Enough GPUs: each local rank its own.
  EXPECT_EQ(rank_device("auto", 2, local_rank_of(1, 2), "").device, "cuda:1");
  EXPECT_EQ(rank_device("cuda", 8, local_rank_of(3, 4), "").device, "cuda:3");
  // One GPU each, through CUDA_VISIBLE_DEVICES: cuda:0 in every rank.
  EXPECT_EQ(rank_device("auto", 1, local_rank_of(1, 2), "1").device, "cuda:0");
  // One GPU for two ranks (torchrun --nproc-per-node 2 on a one-GPU server): both on the CPU.
  for (int r = 0; r < 2; ++r) {
    const auto choice = rank_device("auto", 1, local_rank_of(r, 2), "");
    EXPECT_EQ(choice.device, "cpu") << r;
    EXPECT_NE(choice.reason.find("1 GPU(s) visible to 2 ranks"), std::string::npos) << choice.reason;
    EXPECT_EQ(rank_device("auto", 1, local_rank_of(r, 2), "0,1").device, "cpu") << r;
    EXPECT_THROW(rank_device("cuda", 1, local_rank_of(r, 2), ""), course::UsageError) << r;
  }
  EXPECT_EQ(rank_device("auto", 3, local_rank_of(0, 4), "").device, "cpu");
  // No GPU: the request as given (start_lesson falls back and says why); explicit choices stay.
  EXPECT_EQ(rank_device("auto", 0, local_rank_of(1, 2), "").device, "auto");
  EXPECT_EQ(rank_device("cpu", 4, local_rank_of(1, 2), "").device, "cpu");
  EXPECT_EQ(rank_device("cuda:1", 2, local_rank_of(0, 2), "").device, "cuda:1");
}

// Tests the check the ranks make together before forming a group: all CPU or all GPU, and never
// two ranks on one GPU.
TEST(Lesson09RankDevice, RanksMustAgree) {
  using lesson09::devices_conflict;
  EXPECT_EQ(devices_conflict({"cpu", "cpu", "cpu"}), "");
  EXPECT_EQ(devices_conflict({"cuda:0 GPU-aa", "cuda:1 GPU-bb"}), "");
  EXPECT_EQ(devices_conflict({"cuda:0 GPU-aa", "cuda:0 GPU-bb"}), "");  // each its own GPU 0
  EXPECT_NE(devices_conflict({"cuda:0 GPU-aa", "cpu"}).find("one backend"), std::string::npos);
  EXPECT_NE(devices_conflict({"cpu", "cuda:0 GPU-aa"}).find("rank 1 on cuda:0"), std::string::npos);
  EXPECT_NE(devices_conflict({"cuda:0 GPU-aa", "cuda:1 GPU-bb", "cuda:0 GPU-aa"})
                .find("ranks 0 and 2 share one GPU (GPU-aa)"),
            std::string::npos);
  EXPECT_EQ(lesson09::device_identity(torch::kCPU), "cpu");
}

// Tests the rendezvous' one wait through a real store: two ranks (threads) meet; a rank alone
// gives up after the timeout, not later, with the message that says how many arrived.
TEST(Lesson09RankDevice, RanksMeetOrGiveUpWithinTheTimeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  on_ranks(2, [&](int rank) {
    lesson09::meet_the_others(*store, local_rank_of(rank, 2), torch::kCPU, std::chrono::seconds(10));
  });
  auto empty = c10::make_intrusive<c10d::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  try {
    lesson09::meet_the_others(*empty, local_rank_of(0, 2), torch::kCPU, std::chrono::milliseconds(500));
    ADD_FAILURE() << "met nobody, and went on";
  } catch (const course::CourseError& e) {
    EXPECT_NE(std::string(e.what()).find("gave up waiting for the other ranks"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("1 of 2 arrived"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("within --timeout"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// ---- the rendezvous ------------------------------------------------------------------------------
// Tests that a rank whose MASTER_ADDR:MASTER_PORT has no store gives up after the timeout with a
// HINT, instead of waiting forever.
TEST_F(GlooTest, UnreachableRendezvousIsAClearError) {
  lesson09::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    lesson09::connect_store(info, std::chrono::milliseconds(1500));
    ADD_FAILURE() << "connected to nothing";
  } catch (const course::CourseError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach the rendezvous"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("MASTER_ADDR"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// Tests that rank 0 cannot host the store on a port already taken, and says so.
TEST_F(GlooTest, PortInUseIsAClearError) {
  const int port = free_port();
  c10d::TCPStoreOptions taken;
  taken.port = static_cast<std::uint16_t>(port);
  taken.isServer = true;
  taken.waitWorkers = false;
  auto holder = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", taken);
  lesson09::RankInfo info;
  info.world_size = 2;
  info.master_port = port;
  try {
    lesson09::connect_store(info, std::chrono::milliseconds(2000));
    ADD_FAILURE() << "hosted a second store on port " << port;
  } catch (const course::CourseError& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("MASTER_PORT"), std::string::npos);
  }
}

// ---- the collectives ---------------------------------------------------------------------------
// Tests the flat all-reduce, the broadcast and the cross-rank min/max on a real Gloo group of
// three ranks meeting through a TCPStore, as the lesson's ranks do.
TEST_F(GlooTest, FlatAllreduceAndBroadcast) {
  constexpr int kWorld = 3;
  const int port = free_port();
  on_ranks(kWorld, [&](int rank) {
    lesson09::RankInfo info;
    info.rank = rank;
    info.world_size = kWorld;
    info.master_port = port;
    auto group = lesson09::make_group(lesson09::connect_store(info, timeout), rank, kWorld,
                                      torch::kCPU, timeout);
    // Gradients: rank r holds (r + 1) * [0, 1, 2, ...]; the sum is 6 * [0, 1, 2, ...].
    torch::Tensor grads = torch::arange(1000, torch::kFloat) * static_cast<float>(rank + 1);
    lesson09::allreduce_gradients(*group, grads);
    EXPECT_TRUE(torch::equal(grads, torch::arange(1000, torch::kFloat) * 6.0f)) << rank;
    // Parameters: rank 0's arrive everywhere, in place.
    torch::Tensor values = torch::full({10}, static_cast<float>(rank));
    lesson09::broadcast_parameters(*group, values);
    EXPECT_TRUE(torch::equal(values, torch::zeros({10}))) << rank;
    // Checksums: equal when the tensors are, told apart when one rank differs.
    const auto same = lesson09::min_max_across_ranks(
        *group, lesson09::checksum(torch::ones({5})), torch::kCPU);
    EXPECT_EQ(same.first, same.second);
    const auto differ = lesson09::min_max_across_ranks(
        *group, lesson09::checksum(torch::full({5}, rank == 2 ? 1.0f + 1e-7f : 1.0f)),
        torch::kCPU);
    EXPECT_NE(differ.first, differ.second);
  });
}

// Tests that the checksum sees a single changed bit.
TEST(Lesson09Checksum, SeesOneBit) {
  torch::Tensor a = torch::randn({1000});
  torch::Tensor b = a.clone();
  EXPECT_EQ(lesson09::checksum(a), lesson09::checksum(b));
  torch::Tensor bits = b.view(torch::kInt);
  bits[500] = bits[500].bitwise_xor(1);  // one bit of one float
  EXPECT_NE(lesson09::checksum(a), lesson09::checksum(b));
}

// ---- part 2 against the reference --------------------------------------------------------------
class Lesson09Training : public FashionMnistTest {
 protected:
  void SetUp() override {
    FashionMnistTest::SetUp();
    if (IsSkipped()) return;
    std::string why;
    if (lesson09::backend_for(torch::kCPU, &why).empty()) GTEST_SKIP() << why;
  }
};

// Tests what data parallelism promises, on real ranks (threads, Gloo over a HashStore): every
// rank holds identical parameters after every step, and for the first steps the summed
// gradient is one process's gradient over the global batch from the same parameters.
TEST_F(Lesson09Training, SummedGradientIsTheGlobalBatchsGradient) {
  constexpr int kWorld = 2;
  constexpr std::int64_t kBatch = 32;
  const course::ImageSet data = lesson11::take(train(), 3000);
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::chrono::milliseconds timeout(60000);
  std::vector<lesson09::DistributedRun> runs(kWorld);
  on_ranks(kWorld, [&](int rank) {
    auto group = lesson09::make_group(store, rank, kWorld, torch::kCPU, timeout);
    runs[rank] = lesson09::train_data_parallel(group.get(), rank, kWorld, data, 1, kBatch,
                                               torch::kCPU, lesson09::kSeed, false);
  });
  EXPECT_TRUE(torch::equal(runs[0].trainer.flat.values, runs[1].trainer.flat.values));
  EXPECT_EQ(runs[0].trail.item<std::int64_t>(), runs[1].trail.item<std::int64_t>());
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(runs[rank].gradient_diffs.size(), static_cast<size_t>(lesson09::kCheckedSteps));
    for (const double d : runs[rank].gradient_diffs) {
      EXPECT_LE(d, course::tolerance_for(torch::kFloat)) << "rank " << rank;
    }
  }
}

// Tests that the gradient check tells a wrong sum from a right one: the gradient of half of a
// global batch (a rank whose gradients were never summed) is far from the whole batch's, while
// the two halves' gradients added up are within the tolerance, from the same parameters.
TEST_F(Lesson09Training, GradientCheckCatchesAMissingRank) {
  lesson11::Trainer trainer = lesson11::make_trainer(torch::kCPU, lesson09::kSeed);
  const torch::Tensor all = torch::arange(128, torch::kLong);
  const torch::Tensor whole = lesson09::gradient_of_global_batch(trainer, train(), all, torch::kCPU);
  // Each half's gradient, scaled as a rank scales its share: (half's sum of losses) / 128.
  const torch::Tensor first =
      lesson09::gradient_of_global_batch(trainer, train(), all.slice(0, 0, 64), torch::kCPU) / 2;
  const torch::Tensor second =
      lesson09::gradient_of_global_batch(trainer, train(), all.slice(0, 64, 128), torch::kCPU) / 2;
  EXPECT_LE(course::relative_diff(first + second, whole), course::tolerance_for(torch::kFloat));
  EXPECT_GT(course::relative_diff(first, whole), 100 * course::tolerance_for(torch::kFloat));
  EXPECT_GT(course::relative_diff(2 * (first + second), whole), 0.5);  // averaged twice
}

// Tests that a rank with no samples in the last step (more ranks than samples left) still takes
// part in the all-reduce, so nobody waits for it.
TEST_F(Lesson09Training, ARankWithAnEmptyLastShardKeepsStep) {
  constexpr int kWorld = 3;
  // Batches of 8 per rank: the last global step has 2 samples, all on rank 0.
  const course::ImageSet data = lesson11::take(train(), 50);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::uint64_t> sums(kWorld);
  on_ranks(kWorld, [&](int rank) {
    auto group = lesson09::make_group(store, rank, kWorld, torch::kCPU, std::chrono::seconds(60));
    auto run = lesson09::train_data_parallel(group.get(), rank, kWorld, data, 2, 8, torch::kCPU,
                                             lesson09::kSeed, false);
    sums[rank] = lesson09::checksum(run.trainer.flat.values);
  });
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[1], sums[2]);
}

// ---- NCCL on a GPU ------------------------------------------------------------------------------
// Tests a job of one on NCCL (any one-GPU server): the group connects, every collective of the
// lesson gives its result, the ranks agree on the device, and the group shuts down in order.
TEST(Lesson09Nccl, JobOfOneOnTheGpu) {
  if (course::cuda_device_count() == 0) GTEST_SKIP() << "needs CUDA";
  const torch::Device gpu(torch::kCUDA, 0);
  std::string why;
  if (lesson09::backend_for(gpu, &why).empty()) GTEST_SKIP() << why;
  auto store = c10::make_intrusive<c10d::HashStore>();
  lesson09::RankInfo info;
  lesson09::meet_the_others(*store, info, gpu, std::chrono::seconds(10));
  auto group = lesson09::make_group(store, 0, 1, gpu, std::chrono::seconds(60));
  EXPECT_EQ(lesson09::ranks_answering(*group, gpu, std::chrono::seconds(60)), 1);
  torch::Tensor grads = torch::arange(1000, torch::TensorOptions().device(gpu));
  lesson09::allreduce_gradients(*group, grads);
  EXPECT_TRUE(torch::equal(grads.cpu(), torch::arange(1000, torch::kFloat)));
  torch::Tensor values = torch::full({10}, 3.0f, torch::TensorOptions().device(gpu));
  lesson09::broadcast_parameters(*group, values);
  EXPECT_EQ(values.sum().item<float>(), 30.0f);
  const auto same = lesson09::min_max_across_ranks(*group, 42, gpu);
  EXPECT_EQ(same.first, 42u);
  EXPECT_EQ(same.second, 42u);
  course::shutdown_group(*group);
}

// Tests two NCCL ranks (threads of this process, one GPU each) against the reference, as the
// Gloo test above does on the CPU; needs two GPUs.
TEST(Lesson09Nccl, TwoRanksOnTwoGpusAllreduce) {
  if (course::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  std::string why;
  if (lesson09::backend_for(torch::Device(torch::kCUDA, 0), &why).empty()) GTEST_SKIP() << why;
  auto store = c10::make_intrusive<c10d::HashStore>();
  on_ranks(2, [&](int rank) {
    const torch::Device gpu(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
    auto group = lesson09::make_group(store, rank, 2, gpu, std::chrono::seconds(60));
    EXPECT_EQ(lesson09::ranks_answering(*group, gpu, std::chrono::seconds(60)), 2);
    torch::Tensor grads = torch::arange(1000, torch::TensorOptions().device(gpu)) * (rank + 1.0);
    lesson09::allreduce_gradients(*group, grads);
    EXPECT_TRUE(torch::equal(grads.cpu(), torch::arange(1000, torch::kFloat) * 3.0f)) << rank;
    course::shutdown_group(*group);
  });
}

}  // namespace
