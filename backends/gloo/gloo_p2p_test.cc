// The Gloo communicator's Send and Recv, over each of its transports between ranks of one host:
// shared-memory rings (the default), rings smaller than the messages (every message streams
// through, with the doorbell thread and the background sends at work), rings whose readers poll
// before they sleep, and TCP (shm off).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/gloo/test_util.h"
#include "core/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

enum class Transport { kShm, kSmallRing, kPolling, kTcp };

std::map<std::string, std::string> Options(Transport t) {
  switch (t) {
    case Transport::kShm:
      return {};
    case Transport::kSmallRing:
      return {{"shm_ring_bytes", "4096"}};
    case Transport::kPolling:
      return {{"shm_spin_us", "2000"}};
    case Transport::kTcp:
      return {{"shm", "off"}};
  }
  return {};
}

std::string Name(Transport t) {
  switch (t) {
    case Transport::kShm:
      return "shm";
    case Transport::kSmallRing:
      return "shm4k";
    case Transport::kPolling:
      return "shmpoll";
    case Transport::kTcp:
      return "tcp";
  }
  return "?";
}

class P2p : public ::testing::TestWithParam<std::tuple<int, Transport>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  Transport transport() const { return std::get<1>(GetParam()); }
  // Runs `body` on every rank (a process each) with a communicator over this transport.
  void OnEachRank(absl::Duration timeout, const std::function<void(int, Communicator&)>& body) {
    FileStore store(FreshDir());
    RunRanks(world(), [&](int rank) {
      auto comm = MakeGloo(rank, world(), &store, timeout, Options(transport()));
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(rank, **comm);
    });
  }
};

// A Send and a Recv posted by both sides in either order meet; messages with one tag arrive in
// order; a Recv posted for a later tag does not take an earlier tag's message.
TEST_P(P2p, SendRecvMatchByPeerAndTagInOrder) {
  const int n = world();
  OnEachRank(absl::Seconds(30), [&](int rank, Communicator& c) {
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    // Every rank sends first, then receives (would deadlock if Send blocked until matched).
    std::vector<std::shared_ptr<Work>> works;
    std::vector<Tensor> sent, got;
    for (int k = 0; k < 3; ++k) {  // three messages on tag 7, then one on tag 9
      sent.push_back(Input(DType::kF32, rank, 100 + k, 20 + k));
      works.push_back(c.Send(sent.back(), right, 7));
    }
    sent.push_back(Input(DType::kI64, rank, 64, 30));
    works.push_back(c.Send(sent.back(), right, 9));
    // Receive tag 9 first: it must not take a tag-7 message.
    Tensor t9 = Tensor::Zeros({64}, DType::kI64);
    works.push_back(c.Recv(t9, left, 9));
    for (int k = 0; k < 3; ++k) {
      got.push_back(Tensor::Zeros({100 + k}, DType::kF32));
      works.push_back(c.Recv(got.back(), left, 7));
    }
    // A large message and an empty one, the other way round the ring.
    Tensor big = Input(DType::kU8, rank, 3 << 20, 40);
    Tensor big_in = Tensor::Zeros({3 << 20}, DType::kU8);
    Tensor empty = Tensor::Zeros({0}, DType::kF32);
    works.push_back(c.Recv(big_in, right, 11));
    works.push_back(c.Send(big, left, 11));
    works.push_back(c.Send(empty, left, 12));
    works.push_back(c.Recv(empty, right, 12));
    for (auto& w : works) ASSERT_TRUE(w->Wait().ok());
    EXPECT_TRUE(SameValues(t9, Input(DType::kI64, left, 64, 30)));
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(SameValues(got[k], Input(DType::kF32, left, 100 + k, 20 + k))) << "message " << k;
    }
    EXPECT_TRUE(SameValues(big_in, Input(DType::kU8, right, 3 << 20, 40)));
  });
}

// Messages that arrive before their Recv is posted (kept aside, partly or wholly) and after it,
// many more than a small ring holds, in both directions at once; each side waits for its own
// Sends first, which only works if the other side makes room while it is not waiting for them.
TEST_P(P2p, ManyMessagesBothWaysWaitingForSendsFirst) {
  if (world() != 2) GTEST_SKIP() << "a two-rank exchange";
  OnEachRank(absl::Seconds(30), [&](int rank, Communicator& c) {
    const int peer = 1 - rank;
    constexpr int kMessages = 40;
    std::vector<std::shared_ptr<Work>> sends, recvs;
    std::vector<Tensor> in;
    // Half the Recvs are posted before the Sends, half after them.
    auto post_recvs = [&](int from, int to) {
      for (int k = from; k < to; ++k) {
        in.push_back(Tensor::Zeros({1000 + 997 * k}, DType::kF32));
        recvs.push_back(c.Recv(in.back(), peer, k % 3));
      }
    };
    post_recvs(0, kMessages / 2);
    for (int k = 0; k < kMessages; ++k) {
      sends.push_back(c.Send(Input(DType::kF32, rank, 1000 + 997 * k, k), peer, k % 3));
    }
    post_recvs(kMessages / 2, kMessages);  // before any wait: TCP Sends wait for their Recvs
    for (auto& w : sends) ASSERT_TRUE(w->Wait().ok());
    for (auto& w : recvs) ASSERT_TRUE(w->Wait().ok());
    for (int k = 0; k < kMessages; ++k) {
      EXPECT_TRUE(SameValues(in[k], Input(DType::kF32, peer, 1000 + 997 * k, k)))
          << "message " << k;
    }
  });
}

// Each point-to-point operation completes on its own, not in issue order: rank 1 sends A, then
// receives C and waits for it; rank 0 posts its receive of A only after a message D that rank 1
// sends once C has arrived. Were C's completion queued behind A's (which waits for rank 0's
// receive), both ranks would wait for each other until the timeout (as two pipeline stages
// exchanging activations and gradients did).
TEST_P(P2p, OperationsCompleteIndependently) {
  if (world() != 2) GTEST_SKIP() << "a two-rank exchange";
  OnEachRank(absl::Seconds(20), [&](int rank, Communicator& c) {
    Tensor a = Tensor::Full({1000}, 1.0f), cc = Tensor::Full({10}, 3.0f);
    Tensor d = Tensor::Full({10}, 4.0f);
    if (rank == 1) {
      auto send_a = c.Send(a, 0, 1);
      Tensor got_c = Tensor::Zeros({10});
      ASSERT_TRUE(c.Recv(got_c, 0, 3)->Wait().ok());
      EXPECT_EQ(got_c.ToFloatVector(), cc.ToFloatVector());
      ASSERT_TRUE(c.Send(d, 0, 4)->Wait().ok());
      ASSERT_TRUE(send_a->Wait().ok());
    } else {
      auto send_c = c.Send(cc, 1, 3);
      Tensor got_d = Tensor::Zeros({10}), got_a = Tensor::Zeros({1000});
      ASSERT_TRUE(c.Recv(got_d, 1, 4)->Wait().ok());
      ASSERT_TRUE(c.Recv(got_a, 1, 1)->Wait().ok());
      EXPECT_EQ(got_a.ToFloatVector(), a.ToFloatVector());
      EXPECT_EQ(got_d.ToFloatVector(), d.ToFloatVector());
      ASSERT_TRUE(send_c->Wait().ok());
    }
  });
}

// A Send or Recv whose Work the caller drops still completes, into and from memory the
// communicator keeps alive (the sender's freed block is reused and overwritten at once); a
// Recv polled with IsCompleted finishes without a Wait. The Works are waited for on the
// caller's thread when waited, so these are the paths that need a thread of their own.
TEST_P(P2p, DroppedAndPolledWorksComplete) {
  if (world() != 2) GTEST_SKIP() << "a two-rank exchange";
  OnEachRank(absl::Seconds(20), [&](int rank, Communicator& c) {
    const int64_t n = 1 << 16;
    if (rank == 0) {
      {
        Tensor x = Tensor::Full({n}, 5.0f);
        (void)c.Send(x, 1, 1);
      }
      Tensor reuse = Tensor::Full({n}, -1.0f);  // the block x had, were it freed
      {
        Tensor y = Tensor::Zeros({n});
        (void)c.Recv(y, 1, 2);
      }
      Tensor reuse_y = Tensor::Full({n}, -2.0f);  // the block y had, were it freed
      Tensor z = Tensor::Zeros({4});
      auto w = c.Recv(z, 1, 3);
      while (!w->IsCompleted()) std::this_thread::yield();  // rank 1 sends it unconditionally
      EXPECT_EQ(z.ToFloatVector(), std::vector<float>(4, 7.0f));
      EXPECT_TRUE(w->Wait().ok());
      EXPECT_EQ(reuse.ToFloatVector()[0], -1.0f);
      ASSERT_TRUE(c.Barrier()->Wait().ok());
      // y's message (6.0) went before z's on the same ring: it has landed, in y's kept memory.
      EXPECT_EQ(reuse_y.ToFloatVector(), std::vector<float>(size_t(n), -2.0f));
    } else {
      Tensor got = Tensor::Zeros({n});
      ASSERT_TRUE(c.Recv(got, 0, 1)->Wait().ok());
      EXPECT_EQ(got.ToFloatVector(), std::vector<float>(size_t(n), 5.0f));
      ASSERT_TRUE(c.Send(Tensor::Full({n}, 6.0f), 0, 2)->Wait().ok());
      ASSERT_TRUE(c.Send(Tensor::Full({4}, 7.0f), 0, 3)->Wait().ok());
      ASSERT_TRUE(c.Barrier()->Wait().ok());
    }
  });
}

TEST_P(P2p, ArgumentsAreChecked) {
  const int n = world();
  OnEachRank(absl::Seconds(30), [&](int rank, Communicator& c) {
    Tensor x = Tensor::Zeros({4}, DType::kF32);
    absl::Status self = c.Send(x, rank, 0)->Wait();
    EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(self.message()), HasSubstr("is this rank"));
    absl::Status range = c.Recv(x, n, 0)->Wait();
    EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  });
}

// Which transport carried the messages, told by what only shared memory does: once the pair has
// exchanged a message, a Send that fits in the ring is complete as soon as it is posted, before
// the peer has posted its Recv (rank 1 posts it only after the barrier). Over TCP the Send waits
// for the Recv. Also a Recv of the wrong size fails alone: later messages still arrive.
TEST_P(P2p, SharedMemoryCarriesTheMessagesOfOneHost) {
  if (world() != 2) GTEST_SKIP() << "a two-rank exchange";
  OnEachRank(absl::Seconds(20), [&](int rank, Communicator& c) {
    Tensor first = Tensor::Full({8}, 1.0f);
    if (rank == 0) {
      ASSERT_TRUE(c.Send(first, 1, 0)->Wait().ok());
      auto w = c.Send(Tensor::Full({256}, 2.0f), 1, 1);
      EXPECT_EQ(w->IsCompleted(), transport() != Transport::kTcp);
      ASSERT_TRUE(c.Barrier()->Wait().ok());
      ASSERT_TRUE(w->Wait().ok());
      if (transport() == Transport::kTcp) return;  // the size check below is the rings'
      ASSERT_TRUE(c.Send(Tensor::Full({16}, 3.0f), 1, 2)->Wait().ok());
      ASSERT_TRUE(c.Send(Tensor::Full({4}, 4.0f), 1, 2)->Wait().ok());
    } else {
      ASSERT_TRUE(c.Recv(first, 0, 0)->Wait().ok());
      ASSERT_TRUE(c.Barrier()->Wait().ok());
      Tensor got = Tensor::Zeros({256});
      ASSERT_TRUE(c.Recv(got, 0, 1)->Wait().ok());
      EXPECT_EQ(got.ToFloatVector(), std::vector<float>(256, 2.0f));
      if (transport() == Transport::kTcp) return;  // the size check below is the rings'
      Tensor wrong = Tensor::Zeros({15});
      absl::Status st = c.Recv(wrong, 0, 2)->Wait();
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_THAT(std::string(st.message()), AllOf(HasSubstr("has 64 bytes"),
                                                    HasSubstr("this Recv's tensor 60")));
      Tensor next = Tensor::Zeros({4});
      ASSERT_TRUE(c.Recv(next, 0, 2)->Wait().ok());
      EXPECT_EQ(next.ToFloatVector(), std::vector<float>(4, 4.0f));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndTransports, P2p,
    ::testing::Combine(::testing::Values(2, 3),
                       ::testing::Values(Transport::kShm, Transport::kSmallRing,
                                         Transport::kPolling, Transport::kTcp)),
    [](const ::testing::TestParamInfo<std::tuple<int, Transport>>& info) {
      return absl::StrCat(std::get<0>(info.param), "ranks_", Name(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace braid::gloo_test
