// The launcher as a function: what `launcher ARGS...` does, callable from another program.
// braid::Spawn (launcher/spawn.h) runs a job of its caller's own workers through it, so that a
// user's program and the launcher start, watch and stop workers with one implementation.
#ifndef BRAID_LAUNCHER_LAUNCHER_MAIN_H_
#define BRAID_LAUNCHER_LAUNCHER_MAIN_H_

namespace braid::launcher {

// Runs the launcher with this command line (argv[0] is the launcher's own path, used to find
// the training program when no --program is given) and returns its exit code
// (docs/LAUNCHING.md, *Exit codes*). Call it from the main thread, before other threads exist:
// it blocks SIGINT, SIGTERM, SIGHUP and SIGCHLD in this process for good, becomes a child
// subreaper, and ends the process itself (exit code 2 and one line on stderr) when it cannot
// start the job.
int LauncherMain(int argc, char** argv);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_LAUNCHER_MAIN_H_
