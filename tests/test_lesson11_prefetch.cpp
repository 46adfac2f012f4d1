// Tests of lessons/11_fast_training_loop/prefetch.h: worker threads make a sequence's items ahead
// of the consumer, who gets the same items in the same order whatever the number of workers; the
// workers stay within their lead, a worker's exception reaches the consumer, and a sequence left
// half-way stops.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "prefetch.h"

namespace {

// A make() whose items take uneven times, so that workers finish them out of order.
std::int64_t slow_square(std::int64_t k) {
  std::this_thread::sleep_for(std::chrono::microseconds((k * 7919) % 500));
  return k * k;
}

}  // namespace

// Tests that 1, 2 and 4 workers give the consumer every item once, in order.
TEST(Prefetcher, SameItemsInTheSameOrder) {
  for (const int workers : {1, 2, 4}) {
    lesson11::Prefetcher<std::int64_t> prefetch;
    prefetch.start(/*count=*/100, workers, slow_square);
    for (std::int64_t k = 0; k < 100; ++k) EXPECT_EQ(prefetch.take(k), k * k) << workers;
    EXPECT_THROW(prefetch.take(100), std::out_of_range);
  }
}

// Tests that the workers make at most `ahead` items per worker past the last one taken.
TEST(Prefetcher, StaysWithinItsLead) {
  constexpr int kWorkers = 3;
  constexpr std::int64_t kAhead = 2;
  std::atomic<std::int64_t> made{0};
  lesson11::Prefetcher<std::int64_t> prefetch;
  prefetch.start(
      50, kWorkers,
      [&](std::int64_t k) {
        ++made;
        return k;
      },
      kAhead);
  for (std::int64_t k = 0; k < 50; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // time for the workers to run
    EXPECT_LE(made.load(), k + kAhead * kWorkers) << "before item " << k;
    EXPECT_EQ(prefetch.take(k), k);
  }
}

// Tests that a worker's exception is thrown where the consumer takes its items.
TEST(Prefetcher, WorkerExceptionReachesTheConsumer) {
  lesson11::Prefetcher<std::int64_t> prefetch;
  prefetch.start(20, 2, [](std::int64_t k) -> std::int64_t {
    if (k == 5) throw std::runtime_error("item 5 is bad");
    return k;
  });
  try {
    for (std::int64_t k = 0; k < 20; ++k) prefetch.take(k);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 5 is bad");
  }
}

// Tests that a sequence left half-way stops (its workers joined), and that a new one starts from
// its first item; without workers there is nothing to start.
TEST(Prefetcher, LeftHalfWayThenStartedAgain) {
  lesson11::Prefetcher<std::int64_t> prefetch;
  prefetch.start(1000, 2, slow_square);
  EXPECT_EQ(prefetch.take(0), 0);
  prefetch.start(10, 2, [](std::int64_t k) { return -k; });
  for (std::int64_t k = 0; k < 10; ++k) EXPECT_EQ(prefetch.take(k), -k);
  prefetch.stop();
  EXPECT_THROW(prefetch.start(10, 0, slow_square), std::invalid_argument);
}
