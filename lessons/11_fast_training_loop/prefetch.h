// prefetch.h defines: Prefetcher, worker threads that make the items 0, 1, 2, ... of a sequence
// ahead of one consumer who takes them in order, the way Python's DataLoader(num_workers=N) makes
// batches in worker processes: whichever thread made an item, the consumer gets the same items in
// the same order as if it had made them itself. A worker's exception is thrown to the consumer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lesson11 {

template <typename T>
class Prefetcher {
 public:
  Prefetcher() = default;
  ~Prefetcher() { stop(); }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// Stops the sequence under way (if any), then starts `workers` threads (at least one) making
  /// make(0) ... make(count - 1): each worker claims the next item nobody has claimed, and stays
  /// at most `ahead` items per worker past the last item taken, so that memory stays bounded.
  void start(std::int64_t count, int workers, std::function<T(std::int64_t)> make,
             std::int64_t ahead = 2) {
    if (workers < 1) throw std::invalid_argument("Prefetcher::start: needs at least one worker");
    stop();
    count_ = count;
    limit_ = ahead * workers;
    make_ = std::move(make);
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }

  /// Item k, once a worker has made it; the consumer takes 0, 1, 2, ... in order. Throws the
  /// exception of a worker whose make() threw (the sequence is then over).
  T take(std::int64_t k) {
    if (k < 0 || k >= count_) {
      throw std::out_of_range("Prefetcher::take: item " + std::to_string(k) + " of " +
                              std::to_string(count_));
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return ready_.count(k) != 0 || failure_; });
    if (failure_) std::rethrow_exception(failure_);
    T item = std::move(ready_[k]);
    ready_.erase(k);
    taken_ = k + 1;
    changed_.notify_all();
    return item;
  }

  /// Stops the workers (each finishes the item in hand) and drops what was made and not taken:
  /// a consumer that leaves a sequence half-way (a `break`) calls it, or start() does.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    stop_ = false;
    ready_.clear();
    claimed_ = taken_ = count_ = 0;
    failure_ = nullptr;
  }

 private:
  void work() {
    while (true) {
      std::int64_t k = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock,
                      [&] { return stop_ || claimed_ >= count_ || claimed_ < taken_ + limit_; });
        if (stop_ || claimed_ >= count_) return;
        k = claimed_++;
      }
      T item{};
      std::exception_ptr failure;
      try {
        item = make_(k);
      } catch (...) {
        failure = std::current_exception();  // handed to the consumer, thrown by take()
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure && !failure_) failure_ = failure;
      if (!failure) ready_[k] = std::move(item);
      changed_.notify_all();
      if (failure) return;
    }
  }

  std::function<T(std::int64_t)> make_;
  std::int64_t count_ = 0, limit_ = 0;
  std::int64_t claimed_ = 0, taken_ = 0;  // items handed to workers, items taken by the consumer
  std::map<std::int64_t, T> ready_;       // made, not yet taken
  std::exception_ptr failure_;            // the first worker's exception, thrown by take()
  bool stop_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::thread> threads_;
};

}  // namespace lesson11
