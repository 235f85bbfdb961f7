// The worker processes of one launcher: started each in its own process group with its output
// in a log file (some also echoed to the console), watched, and stopped as a group.
//
// The launcher should be a child subreaper (prctl PR_SET_CHILD_SUBREAPER) so that processes the
// workers leave behind come back to it and are reaped here: Stop returns only when every
// worker's process group is empty. Each worker also gets PR_SET_PDEATHSIG(SIGKILL), a backstop
// for a launcher that dies without stopping them.
//
// Not thread-safe; start and poll from the main thread only (the death signal fires when the
// thread that forked exits).
#ifndef BRAID_LAUNCHER_WORKER_GROUP_H_
#define BRAID_LAUNCHER_WORKER_GROUP_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace braid::launcher {

struct WorkerSpec {
  int rank = 0;
  std::vector<std::string> argv;  // argv[0] is the path of the executable
  std::map<std::string, std::string> env;  // the worker's whole environment
  std::string log_path;  // stdout and stderr go here
  bool append_log = false;  // keep what an earlier attempt wrote
  bool echo = false;  // also copy the output to the launcher's stdout
  // With echo: give the worker a pseudo-terminal instead of a pipe, so that a program that
  // draws a live progress line when it sees a terminal still does (use when our stdout is one).
  bool echo_tty = false;
  // With echo: put this before every line on the console ("[default3]:"), so that the output of
  // several workers can be told apart; whole lines only, so theirs never interleave mid-line.
  // The log gets the output unchanged.
  std::string echo_prefix;
  // Standard input: /dev/null, or with stdin_pipe a pipe that gets stdin_text at once and stays
  // open until CloseStdin (or this process ends), so that the worker sees end-of-file when this
  // process is gone (the hostfile launcher's nodes watch for that).
  bool stdin_pipe = false;
  std::string stdin_text;
};

struct WorkerExit {
  int rank = 0;
  pid_t pid = 0;
  int wait_status = 0;  // as from waitpid
  bool ok() const;
};

// "exited with code 3", "was killed by signal 11 (SIGSEGV: Segmentation fault)".
std::string DescribeWaitStatus(int wait_status);

// The last `n` lines of a file (a progress line rewritten with '\r' counts as its last version).
// Empty when the file cannot be read.
std::vector<std::string> LastLines(const std::string& path, int n);

// mkdir -p.
absl::Status MakeDirs(const std::string& path);

class WorkerGroup {
 public:
  WorkerGroup() = default;
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  // Stops whatever still runs (SIGKILL after a short grace).
  ~WorkerGroup();

  // Starts every worker; on failure, stops those already started.
  absl::Status Start(const std::vector<WorkerSpec>& specs);

  // Waits up to `timeout` for a worker to exit, output to echo, or one of `wake_fds` to become
  // readable; copies echoed output and reaps. Returns the workers that exited since the last
  // call, in the order they were reaped.
  std::vector<WorkerExit> Poll(absl::Duration timeout, const std::vector<int>& wake_fds = {});

  int running() const;
  std::vector<pid_t> pids() const;

  // Sends `sig` to every worker's process group (also those whose leader already exited but
  // left processes behind), SIGKILL after `grace`, and returns once all are gone and reaped
  // (or after grace + 5 s, naming what is left on stderr). Exits that happen meanwhile are
  // returned by the next Poll. `hurry`, polled while waiting, cuts the grace short (a second
  // Ctrl-C).
  void Stop(int sig, absl::Duration grace, const std::function<bool()>& hurry = nullptr);

  // Copies whatever echoed output is buffered, without waiting.
  void DrainOutput();

  // Closes every stdin_pipe: those workers read end-of-file.
  void CloseStdin();

 private:
  struct Worker {
    WorkerSpec spec;
    pid_t pid = -1;
    bool exited = false;
    bool group_gone = false;  // exited and no process left in its group: never signal it again
    int log_fd = -1, echo_fd = -1;  // echo_fd: read end of the output pipe
    int stdin_fd = -1;  // write end of the stdin_pipe
    std::string partial_line;  // with echo_prefix: console output after the last newline
  };
  void Echo(Worker& w, const char* data, size_t n, bool flush);
  void Reap();
  bool GroupsEmpty();
  void CopyEcho(Worker& w);
  void CloseFds(Worker& w);

  std::vector<Worker> workers_;
  std::vector<WorkerExit> pending_;
};

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_WORKER_GROUP_H_
