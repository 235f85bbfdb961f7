// The Journal's bookkeeping and its one-line summary for error messages.
#include "backends/gloo/journal.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace braid::gloo_backend::internal {
namespace {

constexpr size_t kLogLength = 16;

}  // namespace

uint64_t Journal::Add(std::string what) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_id_++;
  entries_.push_back(Entry{id, std::move(what), State::kQueued, absl::Now(), absl::Time()});
  if (entries_.size() > kLogLength) entries_.pop_front();
  return id;
}

void Journal::Start(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = Find(id)) {
    e->state = State::kRunning;
    e->started = absl::Now();
  }
}

void Journal::Finish(uint64_t id, bool ok) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = Find(id)) {
    e->state = ok ? State::kOk : State::kFailed;
    e->took = absl::Now() - e->started;
  }
}

std::string Journal::Recent() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> parts;
  absl::Time now = absl::Now();
  for (const Entry& e : entries_) {
    switch (e.state) {
      case State::kQueued:
        parts.push_back(absl::StrCat(e.what, ": queued ", Round(now - e.issued), " ago"));
        break;
      case State::kRunning:
        parts.push_back(absl::StrCat(e.what, ": running for ", Round(now - e.started)));
        break;
      case State::kOk:
        parts.push_back(absl::StrCat(e.what, ": ok in ", Round(e.took)));
        break;
      case State::kFailed:
        parts.push_back(absl::StrCat(e.what, ": FAILED after ", Round(e.took)));
        break;
    }
  }
  return parts.empty() ? std::string("(none)") : absl::StrJoin(parts, "; ");
}

std::string Journal::Round(absl::Duration d) {
  if (d < absl::Microseconds(100)) return "<100us";
  return absl::FormatDuration(absl::Trunc(d, absl::Microseconds(100)));
}

Journal::Entry* Journal::Find(uint64_t id) {
  for (Entry& e : entries_) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

}  // namespace braid::gloo_backend::internal
