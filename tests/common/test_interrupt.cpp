// Tests of common/interrupt.h: Ctrl-C: a stop request, and what an abandoned epoch says.

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include "common/interrupt.h"
// Tests that under a StopOnInterrupt a SIGINT only sets the stop request (the process goes on),
// that the next guard starts without one, and that the previous handler comes back afterwards.
TEST(StopOnInterrupt, SigintBecomesAStopRequest) {
  struct sigaction before {};
  ::sigaction(SIGINT, nullptr, &before);
  {
    course::StopOnInterrupt guard;
    EXPECT_FALSE(course::stop_requested());
    ::raise(SIGINT);
    EXPECT_TRUE(course::stop_requested());
  }
  {
    course::StopOnInterrupt again;
    EXPECT_FALSE(course::stop_requested());
  }
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

// Tests what an epoch loop that saves after every epoch says when Ctrl-C stops it: the epoch
// abandoned and what the checkpoint holds, or that nothing is saved.
TEST(StopOnInterrupt, AbandonedEpochSaysWhatIsKept) {
  const course::Interrupted stop("after step 12");
  EXPECT_STREQ(course::epoch_abandoned(stop, 2, "run.pt").what(),
               "epoch 3 abandoned after step 12; run.pt holds epoch 2: run the same command to "
               "resume from there");
  EXPECT_STREQ(course::epoch_abandoned(stop, 0, "run.pt").what(),
               "epoch 1 abandoned after step 12; nothing is saved");
  EXPECT_STREQ(course::epoch_abandoned(stop, 2, "").what(),
               "epoch 3 abandoned after step 12; nothing is saved");
}
