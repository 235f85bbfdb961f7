#include "launcher/worker_group.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <termios.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace braid::launcher {

bool WorkerExit::ok() const { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return absl::StrCat("was killed by signal ", sig, " (", abbrev ? "SIG" : "", abbrev ? abbrev : "",
                        abbrev ? ": " : "", strsignal(sig), ")", WCOREDUMP(status) ? ", core dumped" : "");
  }
  return absl::StrCat("ended with wait status ", status);
}

std::vector<std::string> LastLines(const std::string& path, int n) {
  std::vector<std::string> lines;
  if (n <= 0) return lines;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lines;
  constexpr off_t kMax = 64 * 1024;  // enough for any sane last lines; a huge log is not read
  off_t size = lseek(fd, 0, SEEK_END);
  off_t start = std::max<off_t>(0, size - kMax);
  std::string text(size - start, '\0');
  ssize_t got = size > start ? pread(fd, text.data(), text.size(), start) : 0;
  close(fd);
  text.resize(std::max<ssize_t>(got, 0));
  if (start > 0) {  // the first line is cut
    size_t nl = text.find('\n');
    text = nl == std::string::npos ? "" : text.substr(nl + 1);
  }
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    // A line rewritten in place ("\rstep 5 ...\033[K") shows as its last version.
    while (!line.empty() && (line.back() == '\r')) line.pop_back();
    size_t cr = line.rfind('\r');
    if (cr != std::string::npos) line = line.substr(cr + 1);
    size_t esc;
    while ((esc = line.find("\033[K")) != std::string::npos) line.erase(esc, 3);
    lines.push_back(line);
  }
  if (static_cast<int>(lines.size()) > n) lines.erase(lines.begin(), lines.end() - n);
  return lines;
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty folder name");
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create folder '", cur, "': ", strerror(errno)));
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a folder"));
  }
  return absl::OkStatus();
}

namespace {

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a closed console must not stop the job
    p += w;
    n -= w;
  }
}

// Children this process adopted (as subreaper) or started, other than the workers: found
// through /proc because they may have left the workers' process groups.
std::vector<pid_t> ChildrenOfSelf() {
  std::vector<pid_t> out;
  pid_t self = getpid();
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
    std::string s;
    std::getline(f, s);
    size_t rp = s.rfind(')');  // the command name may hold spaces and parentheses
    if (rp == std::string::npos) continue;
    char state;
    int ppid;
    if (sscanf(s.c_str() + rp + 1, " %c %d", &state, &ppid) == 2 && ppid == self) out.push_back(pid);
  }
  closedir(d);
  return out;
}

// A pseudo-terminal: fds[0] the master (ours), fds[1] the worker's side. Output is passed
// through as written (no "\n" -> "\r\n"), and the size is that of our own terminal.
absl::Status OpenPty(int fds[2]) {
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    int e = errno;
    if (master >= 0) close(master);
    return absl::InternalError(absl::StrCat("cannot open a pseudo-terminal: ", strerror(e)));
  }
  char name[128];
  if (ptsname_r(master, name, sizeof name) != 0) {
    close(master);
    return absl::InternalError(absl::StrCat("ptsname: ", strerror(errno)));
  }
  int worker = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (worker < 0) {
    close(master);
    return absl::InternalError(absl::StrCat("cannot open ", name, ": ", strerror(errno)));
  }
  termios tio;
  if (tcgetattr(worker, &tio) == 0) {
    tio.c_oflag &= ~OPOST;
    tcsetattr(worker, TCSANOW, &tio);
  }
  winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) ioctl(worker, TIOCSWINSZ, &ws);
  fds[0] = master;
  fds[1] = worker;
  return absl::OkStatus();
}

}  // namespace

WorkerGroup::~WorkerGroup() {
  if (running() > 0 || !GroupsEmpty()) Stop(SIGKILL, absl::Seconds(1));
  for (Worker& w : workers_) CloseFds(w);
}

void WorkerGroup::CloseFds(Worker& w) {
  if (w.echo_fd >= 0) close(w.echo_fd);
  if (w.log_fd >= 0) close(w.log_fd);
  if (w.stdin_fd >= 0) close(w.stdin_fd);
  w.echo_fd = w.log_fd = w.stdin_fd = -1;
}

void WorkerGroup::CloseStdin() {
  for (Worker& w : workers_) {
    if (w.stdin_fd >= 0) close(w.stdin_fd);
    w.stdin_fd = -1;
  }
}

absl::Status WorkerGroup::Start(const std::vector<WorkerSpec>& specs) {
  pid_t parent = getpid();
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) return absl::InternalError(absl::StrCat("cannot open /dev/null: ", strerror(errno)));
  absl::Status status;
  for (const WorkerSpec& spec : specs) {
    Worker w;
    w.spec = spec;
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (spec.append_log ? O_APPEND : O_TRUNC);
    w.log_fd = open(spec.log_path.c_str(), flags, 0644);
    if (w.log_fd < 0) {
      status = absl::PermissionDeniedError(absl::StrCat("cannot write the log of rank ", spec.rank,
                                                        ", '", spec.log_path, "': ", strerror(errno)));
      break;
    }
    int out_fd = w.log_fd;
    int pipe_fds[2] = {-1, -1};  // [read end (ours), write end (the worker's)]
    if (spec.echo && spec.echo_tty) {
      absl::Status st = OpenPty(pipe_fds);
      if (!st.ok()) {
        status = st;
        CloseFds(w);
        break;
      }
    } else if (spec.echo && pipe2(pipe_fds, O_CLOEXEC) != 0) {
      status = absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
      CloseFds(w);
      break;
    }
    if (spec.echo) {
      w.echo_fd = pipe_fds[0];
      out_fd = pipe_fds[1];
      fcntl(w.echo_fd, F_SETFL, fcntl(w.echo_fd, F_GETFL) | O_NONBLOCK);
    }
    // Close-on-exec: no other worker may hold this one's stdin open.
    int in_fds[2] = {-1, -1};  // [read end (the worker's), write end (ours)]
    if (spec.stdin_pipe && pipe2(in_fds, O_CLOEXEC) != 0) {
      status = absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
      if (pipe_fds[1] >= 0) close(pipe_fds[1]);
      CloseFds(w);
      break;
    }
    const int in_fd = spec.stdin_pipe ? in_fds[0] : devnull;
    // Everything the child needs is built before fork: after it, only async-signal-safe calls.
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string exec_error = absl::StrCat("braid launcher: cannot run ", spec.argv[0], ": ");

    pid_t pid = fork();
    if (pid < 0) {
      status = absl::ResourceExhaustedError(absl::StrCat("fork failed for rank ", spec.rank, ": ",
                                                         strerror(errno)));
      if (pipe_fds[1] >= 0) close(pipe_fds[1]);
      if (in_fds[0] >= 0) close(in_fds[0]), close(in_fds[1]);
      CloseFds(w);
      break;
    }
    if (pid == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      // The launcher ignores SIGPIPE for itself; other dispositions pass on as it inherited them
      // (handlers are reset by exec anyway, and an inherited ignore, e.g. nohup's, is meant).
      sigaction(SIGPIPE, &dfl, nullptr);
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(137);  // the launcher died before the line above
      dup2(in_fd, 0);
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      execve(argv[0], argv.data(), envp.data());
      int err = errno;
      WriteAll(2, exec_error.data(), exec_error.size());
      const char* msg = strerror(err);
      WriteAll(2, msg, strlen(msg));
      WriteAll(2, "\n", 1);
      _exit(127);
    }
    setpgid(pid, pid);  // also here: no window in which a signal to the group misses it
    if (pipe_fds[1] >= 0) close(pipe_fds[1]);
    if (spec.stdin_pipe) {
      close(in_fds[0]);
      w.stdin_fd = in_fds[1];
      // Small (a token line): the pipe's buffer takes it whole, whether or not the worker reads.
      WriteAll(w.stdin_fd, spec.stdin_text.data(), spec.stdin_text.size());
    }
    w.pid = pid;
    workers_.push_back(std::move(w));
  }
  close(devnull);
  if (!status.ok()) Stop(SIGKILL, absl::Seconds(1));
  return status;
}

void WorkerGroup::CopyEcho(Worker& w) {
  char buf[65536];
  while (w.echo_fd >= 0) {
    ssize_t n = read(w.echo_fd, buf, sizeof buf);
    if (n > 0) {
      WriteAll(w.log_fd, buf, n);
      Echo(w, buf, n, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // Every writer is gone: 0 from a pipe, EIO from a pseudo-terminal.
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
      close(w.echo_fd);
      w.echo_fd = -1;
      Echo(w, nullptr, 0, true);
    }
    break;
  }
}

void WorkerGroup::Echo(Worker& w, const char* data, size_t n, bool flush) {
  const std::string& prefix = w.spec.echo_prefix;
  if (prefix.empty()) {
    if (n > 0) WriteAll(1, data, n);
    return;
  }
  w.partial_line.append(data, n);
  std::string out;
  size_t start = 0, nl;
  while ((nl = w.partial_line.find('\n', start)) != std::string::npos) {
    absl::StrAppend(&out, prefix, absl::string_view(w.partial_line).substr(start, nl + 1 - start));
    start = nl + 1;
  }
  w.partial_line.erase(0, start);
  // The end of the output, or a line too long to hold back (a progress line redrawn with '\r').
  if (!w.partial_line.empty() && (flush || w.partial_line.size() > 65536)) {
    absl::StrAppend(&out, prefix, w.partial_line, "\n");
    w.partial_line.clear();
  }
  if (!out.empty()) WriteAll(1, out.data(), out.size());
}

void WorkerGroup::DrainOutput() {
  for (Worker& w : workers_) CopyEcho(w);
}

void WorkerGroup::Reap() {
  while (true) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;  // 0: nothing more exited; -1: no children at all
    for (Worker& w : workers_) {
      if (w.pid == pid && !w.exited) {
        w.exited = true;
        CopyEcho(w);
        pending_.push_back({w.spec.rank, pid, status});
      }
    }
    // Anything else was a process a worker left behind, adopted by us as subreaper.
  }
}

std::vector<WorkerExit> WorkerGroup::Poll(absl::Duration timeout, const std::vector<int>& wake_fds) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    Reap();
    if (!pending_.empty()) break;
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    // Child exits are not file descriptors: wake up now and then to reap.
    int slice_ms = static_cast<int>(std::min<int64_t>(50, absl::ToInt64Milliseconds(left) + 1));
    std::vector<pollfd> fds;
    for (Worker& w : workers_) {
      if (w.echo_fd >= 0) fds.push_back({w.echo_fd, POLLIN, 0});
    }
    size_t first_wake = fds.size();
    for (int fd : wake_fds) fds.push_back({fd, POLLIN, 0});
    int n = poll(fds.data(), fds.size(), slice_ms);
    if (n <= 0) continue;
    DrainOutput();
    bool woken = false;
    for (size_t i = first_wake; i < fds.size(); ++i) woken |= (fds[i].revents != 0);
    if (woken) {
      Reap();
      break;
    }
  }
  std::vector<WorkerExit> out;
  out.swap(pending_);
  return out;
}

int WorkerGroup::running() const {
  int n = 0;
  for (const Worker& w : workers_) n += !w.exited;
  return n;
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (const Worker& w : workers_) out.push_back(w.pid);
  return out;
}

bool WorkerGroup::GroupsEmpty() {
  bool empty = true;
  for (Worker& w : workers_) {
    if (w.group_gone) continue;
    // A reaped leader's pgid cannot be reused while its group has members; once the group is
    // empty it could be, so it is marked and never signalled again.
    if (w.exited && killpg(w.pid, 0) != 0 && errno == ESRCH) {
      w.group_gone = true;
    } else {
      empty = false;
    }
  }
  return empty;
}

void WorkerGroup::Stop(int sig, absl::Duration grace, const std::function<bool()>& hurry) {
  auto signal_all = [&](int s) {
    GroupsEmpty();
    for (const Worker& w : workers_) {
      if (!w.group_gone) killpg(w.pid, s);
    }
  };
  // Done when every worker is reaped, their groups are empty, and no process a worker left
  // behind (outside its group, adopted by us as subreaper) is still around.
  auto wait_until = [&](absl::Time deadline, bool may_hurry, bool kill_strays) {
    while (true) {
      Reap();
      DrainOutput();
      if (running() == 0 && GroupsEmpty()) {
        std::vector<pid_t> strays = ChildrenOfSelf();
        if (strays.empty()) return true;
        if (kill_strays) {
          for (pid_t pid : strays) kill(pid, SIGKILL);
        }
      }
      if (absl::Now() >= deadline || (may_hurry && hurry && hurry())) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
  };
  signal_all(sig);
  if (sig != SIGKILL && wait_until(absl::Now() + grace, true, false)) return;
  signal_all(SIGKILL);
  for (pid_t pid : ChildrenOfSelf()) kill(pid, SIGKILL);
  if (wait_until(absl::Now() + absl::Seconds(5), false, true)) return;
  std::vector<std::string> left;
  for (const Worker& w : workers_) {
    if (!w.group_gone) left.push_back(absl::StrCat("rank ", w.spec.rank, " (pid ", w.pid, ")"));
  }
  std::fprintf(stderr, "braid launcher: after SIGKILL these are still not gone: %s\n",
               absl::StrJoin(left, ", ").c_str());
}

}  // namespace braid::launcher
