#include "launcher/launcher_signals.h"

#include <errno.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace braid::launcher {

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "braid launcher: %s\n", msg.c_str());
  std::fflush(nullptr);
  _exit(kExitLauncherError);
}

void Say(const std::string& msg) {
  std::fprintf(stderr, "braid launcher: %s\n", msg.c_str());
  std::fflush(stderr);
}

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string SigName(int s) {
  const char* a = sigabbrev_np(s);
  return a ? absl::StrCat("SIG", a) : absl::StrCat("signal ", s);
}

Signals::Signals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGCHLD);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    // A signal ignored by whoever started us (nohup; a script's background job for SIGINT)
    // stays ignored, here and in the workers.
    struct sigaction old;
    if (sigaction(s, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&set_, s);
  }
  // Before any thread exists: threads inherit the mask.
  sigprocmask(SIG_BLOCK, &set_, nullptr);
  fd_ = signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd_ < 0) Die(absl::StrCat("signalfd: ", strerror(errno)));
  signal(SIGPIPE, SIG_IGN);  // a closed console or socket is an error, not death
}

int Signals::Poll() {
  signalfd_siginfo info;
  int got = 0;
  while (read(fd_, &info, sizeof info) == sizeof info) {
    int s = static_cast<int>(info.ssi_signo);
    if (s != SIGCHLD) {
      ++count_;
      if (!got) got = s;
    }
  }
  if (got && !first_) first_ = got;
  return got;
}

void ExitInterrupted(int s, const char* what) {
  Say(absl::StrCat("interrupted by ", SigName(s), " while ", what, "; no worker was started"));
  std::_Exit(128 + s);
}

}  // namespace braid::launcher
