// How a training run reports itself: the console and train.log (Reporter), the metrics file's
// JSON lines, and the end-of-run summary. Split from trainer.cc, which keeps what the run does;
// internal to //launcher:trainer.
#ifndef BRAID_LAUNCHER_RUN_REPORT_H_
#define BRAID_LAUNCHER_RUN_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/checkpointer.h"
#include "core/device.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "core/strategy.h"
#include "launcher/monitor/monitor.h"
#include "launcher/trainer.h"

namespace braid::launcher {

std::string FormatDuration(double s);

// Rank 0 owns train.log and the metrics file; other ranks write train.rank<r>.log and
// <metrics>.rank<r> beside them (the launcher shows rank 0's console on the terminal).
std::string LogPath(const TrainerEnv& env);
std::string MetricsPath(const TrainerEnv& env);

// Prints to the console and appends to this rank's log and metrics file. The metrics file is
// appended to, never started again: a restart or a resume into the same folder keeps the earlier
// attempts' lines, minus those of the steps it redoes (launcher/metrics_file.h has the rule).
class Reporter {
 public:
  Reporter(const TrainerEnv& env) : env_(env) {
    if (!env.log_dir.empty()) {
      log_.open(LogPath(env), std::ios::app);
      metrics_.open(MetricsPath(env), std::ios::app);  // checks it can be written
    }
  }
  // Before the first metrics line: drops the lines of the steps from `first_step` on (they are
  // about to be written again) and says in train.log how many.
  absl::Status BeginMetrics(int first_step);
  void Line(const std::string& s) {
    if (!env_.quiet) {
      if (pending_progress_) std::fputc('\n', stdout);
      pending_progress_ = false;
      std::fprintf(stdout, "%s\n", s.c_str());
      std::fflush(stdout);
    }
    if (log_.is_open()) log_ << s << "\n" << std::flush;
  }
  void Progress(const std::string& s, bool keep) {
    if (!env_.quiet) {
      if (env_.interactive) {
        std::fprintf(stdout, "\r%s\033[K", s.c_str());
        pending_progress_ = true;
        if (keep) {
          std::fputc('\n', stdout);
          pending_progress_ = false;
        }
      } else if (keep) {
        std::fprintf(stdout, "%s\n", s.c_str());
      }
      std::fflush(stdout);
    }
    if (keep && log_.is_open()) log_ << s << "\n" << std::flush;
  }
  // One line, stamped with the wall-clock time ("time", Unix seconds).
  void Metric(const std::string& json);
  // For train.log only: facts for whoever debugs a run, not for the console.
  void Note(const std::string& s) {
    if (log_.is_open()) log_ << s << "\n" << std::flush;
  }
  bool ok() const { return env_.log_dir.empty() || (log_.is_open() && metrics_.is_open()); }

 private:
  const TrainerEnv& env_;
  std::ofstream log_, metrics_;
  bool pending_progress_ = false;
};

// What the step loop adds up over the run, for the summary.
struct StepTotals {
  std::vector<double> step_times;
  double fwd = 0, bwd = 0, comm = 0, opt = 0, total = 0;
  int64_t comm_bytes = 0, comm_overlapped = 0;
  std::string comm_what;  // the last step's StepStats::comm_what

  void Add(double dt, const StepStats& st);
};

// wall_clock_breakdown: the step phases' time summed over a print interval, printed as
// DeepSpeed prints its timers: "time (ms) | fwd: .. | bwd: .. | bwd_inner: .. | bwd_allreduce:
// .. | step: ..". DeepSpeed's bwd includes the gradient reduction: here bwd_inner is backward
// (with the reduction it overlaps), bwd_allreduce the reduction time it left exposed.
struct IntervalTimes {
  double fwd = 0, bwd = 0, comm = 0, opt = 0;  // seconds
  int steps = 0;

  void Add(const StepStats& st);
  // The line for steps [first, last] (1-based, as the progress line counts), then starts over.
  std::string TakeLine(int rank, int first, int last);
};

// Model FLOPs utilisation: the model's training FLOPs per token (ModelSpec::train_flops_per_token)
// at `tokens_per_s` over `processes` x `peak_flops` (launcher/peak_flops.h); 0 when unknown.
double Mfu(double flops_per_token, double tokens_per_s, int processes, double peak_flops);

// One step's line in the metrics file. `mp` is null without mixed precision; `mfu` < 0: unknown.
std::string StepMetricJson(int step, const StepStats& st, float lr, double dt, double tps,
                           int64_t peak_bytes, const MixedPrecision* mp, double mfu = -1);

// What the end-of-run summary describes beyond the step totals.
struct RunSummaryInputs {
  int steps = 0, first_step = 0;
  int64_t tokens_per_step = 0;
  const char* unit = "";  // "tok" or "samples"
  Device device;
  absl::Time start;  // when the steps began
  // When they ended (the summary's wall time); InfinitePast: now, when the summary is made.
  absl::Time end = absl::InfinitePast();
  const Strategy* strategy = nullptr;
  const MixedPrecision* mp = nullptr;  // null without mixed precision
  // The checkpoints this run saved (checkpointer is null without a checkpoint section).
  const Checkpointer* checkpointer = nullptr;
  int checkpoints_saved = 0;
  std::string checkpoint_dir;
  double checkpoint_blocked_s = 0;
  bool checkpoint_async = false;
  // For the MFU line (none when either is 0: a model without a FLOPs formula, a device without a
  // measured peak, a rank other than 0).
  double flops_per_token = 0, peak_flops = 0;
  // On the CPU, the ceiling measured at the start, which each step's MFU used; peak_flops is the
  // faster of it and a second measurement at the end (a machine busy at the start measures a low
  // ceiling). 0: peak_flops is the only one.
  double start_peak_flops = 0;
  int processes = 1, threads = 1;
  // Where a CUDA device's peak came from (launcher/peak_flops.h); empty: the CPU's measured one.
  std::string peak_basis;
};

// Figures the summary lines measured that the summary metric repeats.
struct RunEnd {
  int64_t peak_rss = 0;  // bytes
  double wall = 0;       // seconds since RunSummaryInputs::start
  double mfu = -1;       // at the median throughput; < 0: unknown
  double flops_per_token = 0, peak_flops = 0;
  double start_peak_flops = 0;  // as RunSummaryInputs's
};

// Fills `result`'s steady-state throughput and peak memory, then prints the summary lines.
RunEnd ReportRunSummary(Reporter& rep, const RunSummaryInputs& in, const StepTotals& totals,
                        TrainResult& result);

// The metrics file's last line. `eval` is the evaluation's summary fragment ("" for none).
std::string SummaryMetricJson(const std::string& eval, int steps, const TrainResult& result,
                              const RunEnd& end, const MixedPrecision* mp);

// DeepSpeed's monitors (tensorboard, csv_monitor) as the config enables them, on rank 0 (null
// elsewhere, and when none is enabled). Each goes in <output_path>/<job_name>: output_path ""
// is the run folder, a relative one is taken from the workspace under `bazel run`.
absl::StatusOr<std::unique_ptr<monitor::Monitors>> OpenMonitors(const config::TrainConfig& cfg,
                                                                 const TrainerEnv& env,
                                                                 int first_step);

// A step's events under DeepSpeed's tags: Train/Samples/train_loss, lr, loss_scale under fp16,
// and with wall_clock_breakdown its elapsed_time_ms_forward, _backward, _backward_inner,
// _backward_allreduce and _step.
monitor::Events StepEvents(const StepStats& st, float lr, const MixedPrecision* mp,
                           bool wall_clock_breakdown);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_RUN_REPORT_H_
