// The launcher's console messages and its stop signals: SIGINT, SIGTERM and SIGHUP (and
// SIGCHLD) are blocked and read from a signalfd, so that no handler runs on a store thread and
// the launcher's loop can wait for a signal, a worker and output at once.
#ifndef BRAID_LAUNCHER_LAUNCHER_SIGNALS_H_
#define BRAID_LAUNCHER_LAUNCHER_SIGNALS_H_

#include <poll.h>
#include <signal.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace braid::launcher {

// The launcher could not start the job (bad flags, no token, the store unreachable, ...).
constexpr int kExitLauncherError = 2;

// "braid launcher: <msg>" on stderr, then exit(kExitLauncherError). Only before any worker
// exists (_exit: store threads may be running; nothing to clean up).
[[noreturn]] void Die(const std::string& msg);
// "braid launcher: <msg>" on stderr.
void Say(const std::string& msg);
std::string Hostname();
std::string SigName(int s);  // "SIGTERM"

// Signals the launcher handles: all blocked and read from a signalfd, so no handler runs on a
// store thread and the main loop can wait for a signal, a worker and output at once.
class Signals {
 public:
  Signals();
  int fd() const { return fd_; }
  // Reads what arrived; returns the first stop signal (SIGINT/SIGTERM/SIGHUP) seen, or 0.
  int Poll();
  int first() const { return first_; }  // the first stop signal ever received
  int count() const { return count_; }

 private:
  sigset_t set_;
  int fd_ = -1;
  int first_ = 0;
  int count_ = 0;
};

// Prints why and exits 128+s: the launcher was interrupted before any worker existed.
[[noreturn]] void ExitInterrupted(int s, const char* what);

// Runs `fn` on a thread while watching for stop signals: connecting to a master that is not up
// yet may take minutes, and Ctrl-C must still work then (no worker exists yet, so exiting is
// clean).
template <typename T>
T WhileWatchingSignals(Signals& signals, const char* what, std::function<T()> fn) {
  struct State {
    std::mutex mu;
    std::optional<T> result;
  };
  auto state = std::make_shared<State>();
  std::thread([state, fn = std::move(fn)] {
    T r = fn();
    std::lock_guard<std::mutex> lock(state->mu);
    state->result.emplace(std::move(r));
  }).detach();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->result) return std::move(*state->result);
    }
    pollfd p = {signals.fd(), POLLIN, 0};
    poll(&p, 1, 20);
    if (int s = signals.Poll()) {
      ExitInterrupted(s, what);
    }
  }
}

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_LAUNCHER_SIGNALS_H_
