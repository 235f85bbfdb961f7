// The training run's reporting, split from trainer.cc: log and metrics paths, the metrics file's
// JSON lines and the end-of-run summary lines (run_report.h).
#include "launcher/run_report.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "launcher/metrics_file.h"

namespace braid::launcher {

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string FormatDuration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%d:%02d:%02d", t / 3600, (t / 60) % 60, t % 60);
  return absl::StrFormat("%d:%02d", t / 60, t % 60);
}

std::string LogPath(const TrainerEnv& env) {
  return env.rank == 0 ? env.log_dir + "/train.log"
                       : absl::StrCat(env.log_dir, "/train.rank", env.rank, ".log");
}
std::string MetricsPath(const TrainerEnv& env) {
  return env.rank == 0 ? env.metrics_path : absl::StrCat(env.metrics_path, ".rank", env.rank);
}

absl::Status Reporter::BeginMetrics(int first_step) {
  if (!metrics_.is_open()) return absl::OkStatus();
  metrics_.close();
  const std::string path = MetricsPath(env_);
  absl::StatusOr<int> dropped = KeepLinesBeforeStep(path, first_step);
  if (!dropped.ok()) return dropped.status();
  if (*dropped > 0) {
    Note(absl::StrFormat("braid: %s: dropped %d line(s) of an earlier attempt, for steps from %d "
                         "on that this run redoes",
                         path, *dropped, first_step));
  }
  metrics_.open(path, std::ios::app);
  if (!metrics_.is_open()) return absl::PermissionDeniedError(absl::StrCat("cannot append to ", path));
  return absl::OkStatus();
}

void Reporter::Metric(const std::string& json) {
  if (metrics_.is_open()) metrics_ << StampTime(json, absl::Now()) << "\n" << std::flush;
}

void StepTotals::Add(double dt, const StepStats& st) {
  step_times.push_back(dt);
  total += dt;
  fwd += st.forward_s;
  bwd += st.backward_s;
  comm += st.comm_exposed_s;
  opt += st.optimizer_s;
  comm_bytes += st.comm_bytes;
  comm_overlapped += st.comm_bytes_overlapped;
  if (!st.comm_what.empty()) comm_what = st.comm_what;
}

void IntervalTimes::Add(const StepStats& st) {
  fwd += st.forward_s;
  bwd += st.backward_s;
  comm += st.comm_exposed_s;
  opt += st.optimizer_s;
  ++steps;
}

std::string IntervalTimes::TakeLine(int rank, int first, int last) {
  std::string line = absl::StrFormat(
      "braid: steps %d-%d: rank=%d time (ms) | fwd: %.2f | bwd: %.2f | bwd_inner: %.2f | "
      "bwd_allreduce: %.2f | step: %.2f",
      first, last, rank, 1e3 * fwd, 1e3 * (bwd + comm), 1e3 * bwd, 1e3 * comm, 1e3 * opt);
  *this = IntervalTimes();
  return line;
}

double Mfu(double flops_per_token, double tokens_per_s, int processes, double peak_flops) {
  if (!(flops_per_token > 0) || !(peak_flops > 0) || processes < 1) return 0;
  return flops_per_token * tokens_per_s / (double(processes) * peak_flops);
}

std::string StepMetricJson(int step, const StepStats& st, float lr, double dt, double tps,
                           int64_t peak_bytes, const MixedPrecision* mp, double mfu) {
  return absl::StrFormat(
      "{\"step\": %d, \"loss\": %.9g, \"lr\": %.6g, \"step_s\": %.6f, \"tokens_per_s\": %.1f, "
      "\"forward_s\": %.6f, \"backward_s\": %.6f, \"comm_exposed_s\": %.6f, "
      "\"optimizer_s\": %.6f, \"grad_norm\": %s, \"comm_bytes\": %d, "
      "\"comm_bytes_overlapped\": %d, \"peak_bytes\": %d%s%s}",
      step, st.loss, lr, dt, tps, st.forward_s, st.backward_s, st.comm_exposed_s,
      st.optimizer_s,
      // JSON has no inf/NaN: an overflowed step's norm (fp16, skipped) is null.
      std::isfinite(st.grad_norm) ? absl::StrFormat("%.6g", st.grad_norm) : std::string("null"),
      st.comm_bytes, st.comm_bytes_overlapped,
      peak_bytes,
      mfu >= 0 ? absl::StrFormat(", \"mfu\": %.6f", mfu) : std::string(),
      mp == nullptr ? std::string()
                    : absl::StrFormat(", \"loss_scale\": %g, \"skipped\": %s", mp->last_step_scale,
                                      mp->last_step_skipped ? "true" : "false"));
}

RunEnd ReportRunSummary(Reporter& rep, const RunSummaryInputs& in, const StepTotals& totals,
                        TrainResult& result) {
  const int steps = in.steps;
  const MixedPrecision* mp = in.mp;
  // Steady state: leave out the first steps (allocator and cache warm-up) when there are enough.
  std::vector<double> steady(totals.step_times.begin() + std::min<size_t>(totals.step_times.size() / 5, 5),
                             totals.step_times.end());
  double med = Median(steady);
  result.median_tokens_per_s = med > 0 ? double(in.tokens_per_step) / med : 0;
  result.peak_bytes = GetMemoryStats(in.device).peak_bytes;
  rusage usage = {};
  getrusage(RUSAGE_SELF, &usage);
  RunEnd end;
  end.peak_rss = int64_t(usage.ru_maxrss) * 1024;  // the whole process, like `ps`
  end.wall = absl::ToDoubleSeconds(
      (in.end == absl::InfinitePast() ? absl::Now() : in.end) - in.start);
  auto pct = [&](double x) { return totals.total > 0 ? 100.0 * x / totals.total : 0.0; };
  rep.Line(absl::StrFormat(
      "braid: done: %d steps%s in %s, loss %.4f -> %.4f, median %.0f %s/s, peak tensor memory "
      "%.1f MiB (process RSS %.1f MiB)\n"
      "       time: forward %.1f%%, backward %.1f%%, exposed communication %.1f%%, optimizer %.1f%%",
      steps,
      in.first_step > 0
          ? absl::StrFormat(" (%d-%d in this run, resumed at step %d)", in.first_step + 1, steps,
                            in.first_step)
          : std::string(),
      FormatDuration(end.wall), result.first_loss, result.final_loss,
      result.median_tokens_per_s, in.unit, double(result.peak_bytes) / (1 << 20),
      double(end.peak_rss) / (1 << 20), pct(totals.fwd),
      pct(totals.bwd), pct(totals.comm), pct(totals.opt)));
  if (in.flops_per_token > 0 && in.peak_flops > 0) {
    end.flops_per_token = in.flops_per_token;
    end.peak_flops = in.peak_flops;
    end.start_peak_flops = in.start_peak_flops;
    end.mfu = Mfu(in.flops_per_token, result.median_tokens_per_s, in.processes, in.peak_flops);
    std::string basis = in.peak_basis;
    if (basis.empty() && in.start_peak_flops > 0) {
      basis = absl::StrFormat(
          "the f32 matmul ceiling on %d thread(s): the faster of its measurements at the start "
          "(%.1f GFLOP/s, each step's MFU) and at the end",
          in.threads, in.start_peak_flops / 1e9);
    } else if (basis.empty()) {
      basis = absl::StrFormat("the f32 matmul ceiling measured at start on %d thread(s)", in.threads);
    }
    rep.Line(absl::StrFormat(
        "braid: MFU %.1f%%: %.4g FLOP per %s (the model's formula, forward and backward) x median "
        "%.0f %s/s = %.2f GFLOP/s, of %d process(es) x %.1f GFLOP/s (%s)",
        100 * end.mfu, in.flops_per_token, std::string(in.unit) == "tok" ? "token" : "sample",
        result.median_tokens_per_s, in.unit, in.flops_per_token * result.median_tokens_per_s / 1e9,
        in.processes, in.peak_flops / 1e9, basis));
  }
  for (const std::string& line : in.strategy->SummaryLines()) rep.Line("braid: " + line);
  if (mp != nullptr) {
    rep.Line(absl::StrFormat("braid: mixed precision %s: loss scale %g at the end, %d of %d steps "
                             "skipped on inf/NaN gradients",
                             DTypeName(mp->dtype), mp->scaler.scale(), mp->scaler.skipped_steps(),
                             steps - in.first_step));
  }
  if (in.checkpoints_saved > 0) {
    const Checkpointer::SaveStats last = in.checkpointer->last_save();
    rep.Line(absl::StrFormat(
        "braid: checkpoints: %d saved in %s (the last: %.1f MiB from this rank, written in %.0f ms); "
        "training blocked %.0f ms per save%s",
        in.checkpoints_saved, in.checkpoint_dir, double(last.bytes) / (1 << 20), 1e3 * last.write_s,
        1e3 * in.checkpoint_blocked_s / in.checkpoints_saved, in.checkpoint_async ? " (asynchronous)" : ""));
  }
  // What the strategy held of the model's state on this rank (ZeRO's sharding shows here).
  if (auto peaks = in.strategy->ModelStatePeaks(); !peaks.empty()) {
    std::string line = "braid: model state per rank (peak):";
    int64_t sum = 0;
    for (auto& [kind, bytes] : peaks) {
      absl::StrAppend(&line, " ", kind, " ", absl::StrFormat("%.2f MiB", double(bytes) / (1 << 20)), ",");
      sum += bytes;
    }
    line.back() = ';';
    absl::StrAppend(&line, absl::StrFormat(" sum of peaks %.2f MiB", double(sum) / (1 << 20)));
    rep.Line(line);
  }
  auto per_device = AllMemoryStats();
  if (per_device.size() > 1) {
    std::string line = "       peak tensor memory per device:";
    for (auto& [d, m] : per_device) {
      absl::StrAppend(&line, " ", d.ToString(), " ",
                      absl::StrFormat("%.1f MiB", double(m.peak_bytes) / (1 << 20)));
    }
    rep.Line(line);
  }
  if (totals.comm_bytes > 0) {
    rep.Line(absl::StrFormat(
        "       overlap: %.1f MiB of %s per step, %.0f%% of the communication time "
        "hidden behind backward; %.1f ms per step spent waiting after backward",
        double(totals.comm_bytes) / (steps - in.first_step) / (1 << 20),
        totals.comm_what.empty() ? "data communicated" : totals.comm_what,
        100.0 * double(totals.comm_overlapped) / double(totals.comm_bytes), 1e3 * totals.comm / (steps - in.first_step)));
  }
  return end;
}

absl::StatusOr<std::unique_ptr<monitor::Monitors>> OpenMonitors(const config::TrainConfig& cfg,
                                                                 const TrainerEnv& env,
                                                                 int first_step) {
  if (env.rank != 0) return nullptr;  // DeepSpeed's monitors write on rank 0 only
  auto folder = [&](const config::MonitorConfig& m) -> std::string {
    if (!m.enabled()) return "";
    std::string base = m.output_path();
    // Relative to the workspace under `bazel run` (as checkpoint.dir is), not the runfiles tree.
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    if (!base.empty() && base[0] != '/' && ws != nullptr && *ws) base = absl::StrCat(ws, "/", base);
    if (base.empty()) base = env.log_dir;
    if (base.empty()) return "";  // no run folder: no files
    return absl::StrCat(base, "/", m.job_name().empty() ? "DeepSpeedJobName" : m.job_name());
  };
  monitor::MonitorFolders folders{folder(cfg.tensorboard()), folder(cfg.csv_monitor())};
  if (folders.tensorboard.empty() && folders.csv.empty()) return nullptr;
  return monitor::Monitors::Open(folders, first_step, cfg.train_batch_size(), absl::Now());
}

monitor::Events StepEvents(const StepStats& st, float lr, const MixedPrecision* mp,
                           bool wall_clock_breakdown) {
  monitor::Events events = {{"Train/Samples/train_loss", st.loss}, {"Train/Samples/lr", lr}};
  if (mp != nullptr && mp->dtype == DType::kF16) {
    events.push_back({"Train/Samples/loss_scale", mp->last_step_scale});
  }
  if (wall_clock_breakdown) {
    const double ms = 1e3;
    events.push_back({"Train/Samples/elapsed_time_ms_forward", float(ms * st.forward_s)});
    events.push_back({"Train/Samples/elapsed_time_ms_backward",
                      float(ms * (st.backward_s + st.comm_exposed_s))});
    events.push_back({"Train/Samples/elapsed_time_ms_backward_inner", float(ms * st.backward_s)});
    events.push_back({"Train/Samples/elapsed_time_ms_backward_allreduce", float(ms * st.comm_exposed_s)});
    events.push_back({"Train/Samples/elapsed_time_ms_step", float(ms * st.optimizer_s)});
  }
  return events;
}

std::string SummaryMetricJson(const std::string& eval, int steps, const TrainResult& result,
                              const RunEnd& end, const MixedPrecision* mp) {
  return absl::StrFormat(
      "{\"summary\": true, \"eval\": \"%s\", \"steps\": %d, \"first_loss\": %.6f, \"final_loss\": %.6f, "
      "\"median_tokens_per_s\": %.1f, \"peak_bytes\": %d, \"peak_rss_bytes\": %d, "
      "\"wall_s\": %.3f%s%s}",
      eval, steps, result.first_loss, result.final_loss, result.median_tokens_per_s,
      result.peak_bytes, end.peak_rss, end.wall,
      end.mfu >= 0 ? absl::StrFormat(", \"mfu\": %.6f, \"flops_per_token\": %.6g, "
                                     "\"peak_flops_per_s\": %.6g%s",
                                     end.mfu, end.flops_per_token, end.peak_flops,
                                     end.start_peak_flops > 0
                                         ? absl::StrFormat(", \"start_peak_flops_per_s\": %.6g",
                                                           end.start_peak_flops)
                                         : std::string())
                   : std::string(),
      mp == nullptr ? std::string()
                    : absl::StrFormat(", \"precision\": \"%s\", \"loss_scale\": %g, \"skipped_steps\": %d",
                                      DTypeName(mp->dtype), mp->scaler.scale(), mp->scaler.skipped_steps()));
}

}  // namespace braid::launcher
