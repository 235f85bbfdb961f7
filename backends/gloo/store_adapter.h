// gloo::rendezvous::Store on top of a braid::Store: Gloo's connectFullMesh exchanges the pairs'
// addresses through it, so a Gloo group rendezvouses over whatever store the job uses (the
// launcher's TCP store, or an in-memory/file store in tests).
#ifndef BRAID_BACKENDS_GLOO_STORE_ADAPTER_H_
#define BRAID_BACKENDS_GLOO_STORE_ADAPTER_H_

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/store.h"

namespace braid::gloo_backend {

// store->Wait(keys, timeout), but in slices of at most 100 ms: a client that serializes its
// requests (the TCP store's does) is then never held for long, so other threads' calls on it
// (the communicator's heartbeat) get through meanwhile. DeadlineExceeded names the whole wait.
absl::Status WaitInSlices(braid::Store* store, const std::vector<std::string>& keys,
                          absl::Duration timeout);

// Keys become "<prefix>/<key>" in `store` (not owned). Values are passed through unchanged
// (they are binary: Gloo stores raw socket addresses). Gloo's interface has no error returns,
// so a failing store call throws gloo::IoException with the store's message; a get or wait
// without an explicit timeout waits `default_timeout`.
class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(braid::Store* store, std::string prefix, absl::Duration default_timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }

  braid::Store* store_;
  std::string prefix_;
  absl::Duration default_timeout_;
};

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_STORE_ADAPTER_H_
