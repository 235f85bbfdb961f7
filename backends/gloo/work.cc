// GlooWork's and P2pOp's waits: the collectives' bounded wait, and the point-to-point wait on
// the transport (on the caller's thread, or a background one when nobody waits).
#include "backends/gloo/work.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/gloo/settings.h"

namespace braid::gloo_backend::internal {

absl::Status GlooWork::WaitFor(absl::Duration budget) {
  {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&done_), budget)) return status_;
  }
  // The operation itself is bounded by the timeout, so this means it has not even started
  // (queued behind a slow one) or is stuck outside Gloo's control.
  return absl::DeadlineExceededError(absl::StrCat(
      "gloo ", what_, " in ", core_->group.Describe(), " on ", core_->group.Rank(core_->group.rank),
      ": not finished after waiting ", absl::FormatDuration(budget),
      ". Recent operations on this rank, oldest first: ", core_->journal.Recent()));
}

bool GlooWork::IsCompleted() {
  absl::MutexLock lock(&mu_);
  return done_;
}

void GlooWork::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

absl::Status P2pOp::Wait(absl::Duration budget) {
  {
    absl::MutexLock lock(&mu_);
    if (done_) return status_;
    if (claimed_) {  // another thread is on the transport: wait for its result
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), budget)) return status_;
      return absl::DeadlineExceededError(absl::StrCat(
          "gloo ", what_, " in ", core_->group.Describe(), ": not finished after waiting ",
          absl::FormatDuration(budget),
          ". Recent operations on this rank, oldest first: ", core_->journal.Recent()));
    }
    claimed_ = true;
  }
  return Block();
}

bool P2pOp::IsCompleted() {
  absl::MutexLock lock(&mu_);
  if (!done_ && !claimed_) WaitInBackground();
  return done_;
}

void P2pOp::Release() {
  absl::MutexLock lock(&mu_);
  if (!done_ && !claimed_) WaitInBackground();
}

void P2pOp::WaitInBackground() {
  claimed_ = true;
  core_->p2p_threads.Start([self = shared_from_this()] { (void)self->Block(); });
}

absl::Status P2pOp::Block() {
  const absl::Time start = absl::Now();
  absl::Status st;
  try {
    if (send_) {
      buf_->waitSend(Ms(timeout_));
    } else {
      buf_->waitRecv(Ms(timeout_));
    }
  } catch (const std::exception& e) {
    st = core_->P2pFailed(what_, peer_, absl::StrCat("Gloo: ", e.what()), absl::Now() - start,
                          timeout_);
  }
  core_->journal.Finish(id_, st.ok());
  absl::MutexLock lock(&mu_);
  status_ = st;
  done_ = true;
  buf_.reset();
  keep_ = Tensor();
  return st;
}

}  // namespace braid::gloo_backend::internal
