#include "launcher/job_token.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "backends/store/tcp_store.h"

namespace braid::launcher {
namespace {

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", strerror(errno));
}

// A folder that is ours alone: anything else could let another user read or plant the token.
absl::Status CheckPrivate(const std::string& path, bool want_dir, mode_t forbidden) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::NotFoundError(Errno("cannot stat", path));
  if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, " is not a ", want_dir ? "folder" : "plain file", "; remove it"));
  }
  if (st.st_uid != ::getuid() || (st.st_mode & forbidden) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        path, " must belong to you (uid ", ::getuid(), ") with no access for others (mode ",
        want_dir ? "0700" : "0600", "); fix it with chmod, or remove it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  if (absl::Status st = CheckPrivate(path, false, 0077); !st.ok()) return st;
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return absl::PermissionDeniedError(Errno("cannot open", path));
  char buf[129];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  std::string t(buf, n > 0 ? size_t(n) : 0);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.size() < 32) {
    return absl::DataLossError(absl::StrCat(path, " holds no job token (", t.size(),
                                            " characters); remove it and start again"));
  }
  return t;
}

}  // namespace

bool IsLoopbackAddress(const std::string& addr) {
  if (addr == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, addr.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, addr.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::StatusOr<std::string> PrivateFolder() {
  std::string dir;
  if (const char* x = ::getenv("XDG_RUNTIME_DIR"); x && *x) {
    dir = absl::StrCat(x, "/braid");
  } else if (const char* h = ::getenv("HOME"); h && *h) {
    std::string cache = absl::StrCat(h, "/.cache");
    ::mkdir(cache.c_str(), 0700);
    dir = absl::StrCat(cache, "/braid");
  } else {
    dir = absl::StrCat("/tmp/braid-", ::getuid());
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(Errno("cannot create", dir));
  }
  if (absl::Status st = CheckPrivate(dir, true, 0077); !st.ok()) return st;
  return dir;
}

absl::StatusOr<SharedToken> LocalJobToken(const std::string& folder, const std::string& addr,
                                          int port) {
  SharedToken out;
  out.path = absl::StrCat(folder, "/job-token-", addr, "-", port);
  // Written in full under a temporary name, then linked to the final name: link() fails if the
  // name exists, so of two launchers starting together exactly one creates it, and a reader
  // never sees a half-written file.
  absl::StatusOr<std::string> fresh = GenerateJobToken();
  if (!fresh.ok()) return fresh.status();
  // mkstemp: a name no other launcher (or thread) uses, created 0600 with O_EXCL.
  std::string tmp = absl::StrCat(out.path, ".tmp.XXXXXX");
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) return absl::PermissionDeniedError(Errno("cannot create", tmp));
  std::string line = *fresh + "\n";
  bool written = ::write(fd, line.data(), line.size()) == ssize_t(line.size());
  ::close(fd);
  if (!written) {
    ::unlink(tmp.c_str());
    return absl::ResourceExhaustedError(Errno("cannot write", tmp));
  }
  int linked = ::link(tmp.c_str(), out.path.c_str());
  int link_errno = errno;
  ::unlink(tmp.c_str());
  if (linked == 0) {
    out.token = *fresh;
    out.created = true;
    return out;
  }
  if (link_errno != EEXIST) {
    errno = link_errno;
    return absl::PermissionDeniedError(Errno("cannot create", out.path));
  }
  absl::StatusOr<std::string> t = ReadToken(out.path);
  if (!t.ok()) return t.status();
  out.token = *t;
  return out;
}

absl::StatusOr<std::string> ReadJobTokenFile(const std::string& path) {
  if (path == "-") {
    // The first line of standard input (the hostfile launcher writes the token there, so that
    // it is on no command line): read byte by byte, so nothing after the line is taken from
    // whoever reads standard input next (--watch_stdin).
    std::string line;
    while (line.size() <= 4096) {
      char c;
      ssize_t n = ::read(0, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::PermissionDeniedError(Errno("--job_token_file: cannot read", "standard input"));
      if (n == 0 || c == '\n') break;
      line += c;
    }
    if (line.empty() || line.size() > 4096) {
      return absl::InvalidArgumentError(
          "--job_token_file=-: the first line of standard input should hold the job token (one "
          "word, e.g. from openssl rand -hex 32)");
    }
    for (char c : line) {
      if (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(
            "--job_token_file=-: the first line of standard input holds more than one word; it "
            "should hold one token");
      }
    }
    return line;
  }
  // A Secret's file is a symbolic link into the volume's current data: follow it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(Errno("--job_token_file: cannot open", path),
                                            " (is the secret mounted there?)"));
  }
  constexpr size_t kMax = 4096;
  std::string text;
  char buf[1024];
  while (text.size() <= kMax) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      errno = err;
      return absl::PermissionDeniedError(Errno("--job_token_file: cannot read", path));
    }
    if (n == 0) break;
    text.append(buf, n);
  }
  ::close(fd);
  if (text.size() > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job_token_file: ", path, " is larger than ", kMax, " bytes; it should hold one token"));
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job_token_file: ", path, " is empty; write a token into it, e.g. openssl rand -hex 32"));
  }
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job_token_file: ", path, " holds more than one word; it should hold one token "
          "(e.g. openssl rand -hex 32)"));
    }
  }
  return text;
}

absl::StatusOr<std::optional<std::string>> GivenJobToken(const std::string& file,
                                                         const char* env_value) {
  const bool env_set = env_value != nullptr && *env_value != '\0';
  if (file.empty()) {
    if (!env_set) return std::optional<std::string>();
    return std::optional<std::string>(env_value);
  }
  absl::StatusOr<std::string> from_file = ReadJobTokenFile(file);
  if (!from_file.ok()) return from_file.status();
  if (env_set && *from_file != env_value) {
    // Neither value is printed: both are secrets.
    return absl::InvalidArgumentError(absl::StrCat(
        "the job token in --job_token_file=", file, " differs from $BRAID_JOB_TOKEN; every "
        "launcher and worker must use one token: unset BRAID_JOB_TOKEN or make them equal"));
  }
  return std::optional<std::string>(*std::move(from_file));
}

absl::StatusOr<std::string> ChooseJobToken(const std::string& file, const char* env_value,
                                           const JobShape& job) {
  absl::StatusOr<std::optional<std::string>> given = GivenJobToken(file, env_value);
  if (!given.ok()) return given.status();
  if (*given) return **given;
  if (job.num_launchers > 1 && IsLoopbackAddress(job.master_addr)) {
    // Every node is on this machine: the launchers share a token through a file only this user
    // can read, so the two-terminal run needs nothing set.
    absl::StatusOr<std::string> folder = PrivateFolder();
    absl::StatusOr<SharedToken> shared =
        folder.ok() ? LocalJobToken(*folder, job.master_addr, job.master_port)
                    : absl::StatusOr<SharedToken>(folder.status());
    if (!shared.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot share a job token between the launchers on this machine: ",
          shared.status().message(),
          ". Or set the same BRAID_JOB_TOKEN for every launcher: export "
          "BRAID_JOB_TOKEN=$(openssl rand -hex 32)"));
    }
    return shared->token;
  }
  if (job.num_launchers > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a job of ", job.num_launchers, " launchers (", job.describe,
        ") needs the same secret job token on every node, and BRAID_JOB_TOKEN is not set. Create "
        "one and set it everywhere before starting the launchers:\n  export BRAID_JOB_TOKEN=$(openssl "
        "rand -hex 32)\n(or give every launcher --job_token_file=FILE, e.g. a mounted secret)"));
  }
  absl::StatusOr<std::string> t = GenerateJobToken();
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("cannot generate a job token: ", t.status().message()));
  }
  return *t;
}

}  // namespace braid::launcher
