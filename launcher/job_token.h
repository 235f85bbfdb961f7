// The job token every launcher and worker of one job shares (the store's HMAC key).
#ifndef BRAID_LAUNCHER_JOB_TOKEN_H_
#define BRAID_LAUNCHER_JOB_TOKEN_H_

#include <optional>
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

// The job token kept in a file, e.g. a Kubernetes Secret mounted into the pod, so that it is
// never on a command line (where ps shows it) nor in the pod's spec: the file's text without the
// trailing newline. Refused when empty, over 4 KiB, or with whitespace inside (a file holding
// something other than one token). "-" reads the first line of standard input instead.
absl::StatusOr<std::string> ReadJobTokenFile(const std::string& path);

// The token the user gave, if any: from --job_token_file (`file`, "" = not given) or from
// $BRAID_JOB_TOKEN (`env_value`, nullptr or "" = not set). Both given must hold the same token,
// else the error names both. std::nullopt: neither was given.
absl::StatusOr<std::optional<std::string>> GivenJobToken(const std::string& file,
                                                         const char* env_value);

// The job's token: the one the user gave (GivenJobToken); else, with several launchers all on
// this machine (a loopback master), one shared through a private file (LocalJobToken); else,
// with one launcher, a fresh one. Several launchers on several machines and none given is an
// error that says how to give one.
struct JobShape {
  int num_launchers = 1;
  std::string master_addr;
  int master_port = 0;
  std::string describe;  // the layout, for the message
};
absl::StatusOr<std::string> ChooseJobToken(const std::string& file, const char* env_value,
                                           const JobShape& job);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_JOB_TOKEN_H_
