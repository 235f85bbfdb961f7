// The job token every launcher and worker of one job shares (the store's HMAC key).
#ifndef BRAID_LAUNCHER_JOB_TOKEN_H_
#define BRAID_LAUNCHER_JOB_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"

namespace braid::launcher {

// True for addresses that can only mean this machine (127.0.0.0/8, ::1, "localhost").
bool IsLoopbackAddress(const std::string& addr);

// The folder for per-user files of launchers on this machine: $XDG_RUNTIME_DIR/braid, else
// $HOME/.cache/braid, else /tmp/braid-<uid>. Created with mode 0700; refused unless it is a
// real folder owned by this user that no one else can read.
absl::StatusOr<std::string> PrivateFolder();

// When every node of a job runs on this machine (a loopback master), the launchers need no
// BRAID_JOB_TOKEN from the user: the first of them writes a fresh token to
// <folder>/job-token-<addr>-<port> (mode 0600, created atomically), the others read it. Only
// this user can read the file, which is what the token protects against. A file left by an
// earlier job on the same address is reused: it is as secret as a new one.
struct SharedToken {
  std::string token;
  std::string path;  // where it lives, for the launcher's message
  bool created = false;
};
absl::StatusOr<SharedToken> LocalJobToken(const std::string& folder, const std::string& addr,
                                          int port);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_JOB_TOKEN_H_
