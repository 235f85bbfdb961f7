// The training steps of a run (trainer_run_internal.h): the loop's start (metrics, monitors, MFU
// terms, prefetching), each step with its progress and metrics lines, evaluation and checkpoints
// when due, and the report, evaluation and weights at the end.
#include <csignal>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "backends/cuda/device_check.h"
#include "backends/in_process/in_process_communicator.h"
#include "backends/store/tcp_store.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/checkpointer.h"
#include "core/deferred_init.h"
#include "core/mesh.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/store.h"
#include "core/strategy.h"
#include "core/weights_match.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"
#include "launcher/batch_sources.h"
#include "launcher/compose.h"
#include "launcher/config/config.h"
#include "launcher/device_binding.h"
#include "launcher/elastic_batch.h"
#include "launcher/evaluation.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "launcher/net.h"
#include "launcher/optimization.h"
#include "launcher/peak_flops.h"
#include "launcher/run_folder.h"
#include "launcher/run_report.h"
#include "launcher/trainer_run_internal.h"
#include "plugins/checkpoint/safetensors.h"
#include "plugins/checkpoint/sharded_safetensors.h"

namespace braid::launcher::internal {

absl::Status Run::SaveCheckpoint(int done_steps) {
  BRAID_ASSIGN_OR_RETURN(std::vector<StateChunk> chunks, strategy_->StateChunks(/*create=*/false));
  std::map<std::string, std::string> extra = {{"batches_drawn", absl::StrCat(batches_drawn_)},
                                              {"step", absl::StrCat(done_steps)}};
  // The one shape field no tensor shows, for tools/sample to rebuild the model from the weights.
  if (cfg_.model().has_n_head()) extra["n_head"] = absl::StrCat(cfg_.model().n_head());
  if (mp_ != nullptr) mp_->scaler.SaveTo(&extra);
  return checkpointer_->Save(done_steps, chunks, extra, *group_[0]);
}

absl::Status Run::Loop() {
  BRAID_RETURN_IF_ERROR(BeginLoop());
  while (!done()) BRAID_RETURN_IF_ERROR(Step().status());
  return EndLoop();
}

// Before the first step: the metrics file, monitors, the MFU's terms, the data's prefetching.
absl::Status Run::BeginLoop() {
  // Appends to the metrics of an earlier attempt in this folder, minus the steps redone here.
  BRAID_RETURN_IF_ERROR(rep_->BeginMetrics(first_step_));
  BRAID_ASSIGN_OR_RETURN(monitors_, OpenMonitors(cfg_, env_, first_step_));
  if (monitors_ != nullptr) rep_->Line("braid: monitors: " + monitors_->Describe());
  // MFU, on rank 0 (whose console the launcher shows): measured while the other ranks wait for
  // the first step's collectives, so they do not share the cores with the measurement.
  if (env_.rank == 0) {
    BRAID_ASSIGN_OR_RETURN(ModelSpec spec, Registry::Get().GetModel(cfg_.model().name()));
    if (spec.train_flops_per_token) {
      flops_per_token_ = spec.train_flops_per_token(cfg_.model());
      // On CUDA the peak depends on the products' dtype (tensor cores for bf16/f16).
      std::string basis;
      peak_flops_ = MeasurePeakFlops(device_, mp_ != nullptr ? mp_->dtype : DType::kF32, &basis);
      if (device_.type == DeviceType::kCUDA) peak_basis_ = basis;
      rep_->Note(absl::StrFormat("braid: MFU's terms: %.6g FLOP per %s (the model's formula), "
                                 "peak %.4g FLOP/s per process (%s)",
                                 flops_per_token_, unit_, peak_flops_, basis));
    }
  }
  // Peaks from here on: the training steps, not model construction.
  GetAllocator(device_)->ResetPeak();
  for (auto& [d, m] : AllMemoryStats()) GetAllocator(d)->ResetPeak();
  start_ = absl::Now();
  // A test hook (tests/distributed/checkpoint_test.sh): BRAID_FAULT=kill_at_step:N makes the
  // last rank kill itself at the start of step N in the group's first attempt, as a crash would.
  if (const char* fault = std::getenv("BRAID_FAULT"); fault != nullptr) {
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    absl::string_view f(fault);
    if (absl::ConsumePrefix(&f, "kill_at_step:") && (attempt == nullptr || std::string(attempt) == "0") &&
        env_.rank == env_.world_size - 1) {
      (void)absl::SimpleAtoi(f, &kill_at_step_);
    }
  }
  // Made after a resume's fast-forward, which draws from the source directly.
  next_batch_ = [this]() { return source_->Next(); };
  if (device_.type == DeviceType::kCUDA) {
    BRAID_ASSIGN_OR_RETURN(next_batch_, cuda::PrefetchBatches(device_, next_batch_));
  }
  print_every_ = std::max(1, cfg_.log().print_every());
  step_ = first_step_;
  return absl::OkStatus();
}

// One training step, as its phases: the micro-batches, the step's hyperparameters, the
// strategy's TrainStep, the progress and metrics lines; then evaluation and a checkpoint when due.
absl::StatusOr<StepStats> Run::Step() {
  BRAID_CHECK(!done()) << "Step after the last step (" << steps_ << ")";
  const int step = step_++;
  if (step == kill_at_step_) std::raise(SIGKILL);
  std::vector<Batch> micro = NextMicroBatches();
  const float lr = SetStepHyperparameters(step);
  absl::Time t0 = absl::Now();
  BRAID_ASSIGN_OR_RETURN(StepStats st, strategy_->TrainStep(micro, loss_fn_));
  const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!std::isfinite(st.loss)) {
    return absl::InternalError(absl::StrCat("loss became ", st.loss, " at step ", step,
                                            ": lower the learning rate or check the data"));
  }
  BRAID_RETURN_IF_ERROR(ReportStep(step, st, lr, dt));
  BRAID_RETURN_IF_ERROR(EvaluateIfDue(step));
  BRAID_RETURN_IF_ERROR(CheckpointIfDue(step));
  return st;
}

// The step's accum_ micro-batches, in the model's input dtype under mixed precision.
std::vector<Batch> Run::NextMicroBatches() {
  std::vector<Batch> micro;
  for (int i = 0; i < accum_; ++i) {
    Batch b = next_batch_();
    micro.push_back(mp_ != nullptr ? CastInputs(b, mp_->dtype) : b);
  }
  batches_drawn_ += accum_;
  return micro;
}

// The schedule's learning rate (and Adam's betas, when scheduled) for `step`, on every rank;
// returns the learning rate.
float Run::SetStepHyperparameters(int step) {
  const float lr = schedule_->At(step);
  strategy_->optimizer()->SetLearningRate(lr);
  if (betas_) {
    const auto [beta1, beta2] = betas_(step);
    strategy_->optimizer()->SetBetas(beta1, beta2);
  }
  return lr;
}

// The step's metrics line, monitors, progress line and (wall_clock_breakdown) timer line.
absl::Status Run::ReportStep(int step, const StepStats& st, float lr, double dt) {
  totals_.Add(dt, st);
  if (step == first_step_) result_.first_loss = st.loss;
  result_.final_loss = st.loss;
  double tps = double(tokens_per_step_) / dt;
  double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
  double eta = elapsed / (step + 1) * (steps_ - step - 1);
  const double mfu = Mfu(flops_per_token_, tps, env_.world_size, peak_flops_);
  rep_->Metric(StepMetricJson(step, st, lr, dt, tps, GetMemoryStats(device_).peak_bytes, mp_.get(),
                              peak_flops_ > 0 && flops_per_token_ > 0 ? mfu : -1));
  if (monitors_ != nullptr) {
    BRAID_RETURN_IF_ERROR(monitors_->Write(
        step, StepEvents(st, lr, mp_.get(), cfg_.wall_clock_breakdown()), absl::Now()));
  }
  interval_.Add(st);
  bool keep = step % print_every_ == 0 || step == steps_ - 1;
  rep_->Progress(absl::StrFormat("step %*d/%d | loss %.4f | %s %s/s%s | lr %.2e | ETA %s",
                                 int(std::to_string(steps_).size()), step + 1, steps_, st.loss,
                                 absl::StrFormat("%.0f", tps), unit_,
                                 mfu > 0 ? absl::StrFormat(" | MFU %.1f%%", 100 * mfu) : "",
                                 lr, FormatDuration(eta)),
                 keep);
  // DeepSpeed's timer line, every print interval (steps_per_print is log.print_every).
  if (keep && cfg_.wall_clock_breakdown()) {
    rep_->Line(interval_.TakeLine(env_.rank, step + 2 - interval_.steps, step + 1));
  }
  return absl::OkStatus();
}

// The config's held-out evaluation after `step`, when its interval says so.
absl::Status Run::EvaluateIfDue(int step) {
  if (eval_ == nullptr || !eval_->Due(step, steps_)) return absl::OkStatus();
  BRAID_ASSIGN_OR_RETURN(EvalResult ev, eval_->Run(*strategy_, *model_));
  rep_->Metric(Evaluation::MetricJson(step, ev));
  rep_->Progress(Evaluation::Line(step, steps_, ev), /*keep=*/true);
  if (monitors_ != nullptr) {  // beside Train/Samples/train_loss, at the same x
    BRAID_RETURN_IF_ERROR(monitors_->Write(
        step, {{"Eval/Samples/val_loss", float(ev.loss)}, {"Eval/Samples/val_ppl", float(ev.perplexity)}},
        absl::Now()));
  }
  return absl::OkStatus();
}

// A sharded checkpoint after `step` when one is due (every checkpoint.every_steps, and the
// last step). Returns the regroup status when an elastic job stops here for a joining node.
absl::Status Run::CheckpointIfDue(int step) {
  if (checkpointer_ == nullptr) return absl::OkStatus();
  BRAID_RETURN_IF_ERROR(checkpointer_->Poll(*group_[0]));  // commits a finished async save
  const int every = cfg_.checkpoint().every_steps();
  if (!((every > 0 && (step + 1) % every == 0) || step == steps_ - 1)) return absl::OkStatus();
  BRAID_RETURN_IF_ERROR(SaveCheckpoint(step + 1));
  // The checkpoint names this run's folder, so that a new command resumed from it
  // continues these metrics (launcher/run_folder.h). Best effort: the save itself stands.
  if (env_.rank == 0 && !env_.log_dir.empty()) {
    if (absl::Status st = RecordRunFolder(checkpoint_options_.dir, env_.log_dir); !st.ok()) {
      rep_->Note(absl::StrCat("braid: could not name the run folder in the checkpoint: ",
                              st.message()));
    }
  }
  ++checkpoints_saved_;
  checkpoint_blocked_s_ += checkpointer_->last_save().blocked_s;
  // An elastic job grows here when a node waits to join: every rank stops after this
  // checkpoint, and the next round resumes from it.
  if (elastic_ != nullptr && step + 1 < steps_) {
    BRAID_ASSIGN_OR_RETURN(std::optional<std::string> joiner, elastic_->AfterCheckpoint(step + 1));
    if (joiner) {
      BRAID_RETURN_IF_ERROR(checkpointer_->Wait());
      return RegroupStatus(step + 1, *joiner);
    }
  }
  return absl::OkStatus();
}

absl::Status Run::EndLoop() {
  if (checkpointer_ != nullptr) BRAID_RETURN_IF_ERROR(checkpointer_->Wait());
  return absl::OkStatus();
}

absl::Status Run::SaveWeights(const std::string& path) {
  // Collective for sharded strategies: every rank gathers, rank 0 writes.
  BRAID_ASSIGN_OR_RETURN(auto state, strategy_->FullStateDict());
  if (env_.rank == 0) {
    std::map<std::string, std::string> meta = {{"format", "pt"}};
    if (cfg_.model().has_n_head()) meta["n_head"] = absl::StrCat(cfg_.model().n_head());
    BRAID_RETURN_IF_ERROR(SaveSafetensors(path, state, meta));
    rep_->Line(absl::StrCat("braid: wrote weights to ", path));
  }
  return absl::OkStatus();
}

// The summary, the evaluation, the weights (save_to) and where the files are.
absl::StatusOr<TrainResult> Run::Finish() {
  result_.steps = steps_;
  RunSummaryInputs summary;
  summary.steps = steps_;
  summary.first_step = first_step_;
  summary.tokens_per_step = tokens_per_step_;
  summary.unit = unit_.c_str();  // lives as long as this run
  summary.device = device_;
  summary.start = start_;
  summary.strategy = strategy_.get();
  summary.mp = mp_.get();
  summary.checkpointer = checkpointer_.get();
  summary.checkpoints_saved = checkpoints_saved_;
  summary.checkpoint_dir = checkpointer_ != nullptr ? checkpoint_options_.dir : "";
  summary.checkpoint_blocked_s = checkpoint_blocked_s_;
  summary.checkpoint_async = cfg_.checkpoint().async();
  summary.flops_per_token = flops_per_token_;
  summary.peak_flops = peak_flops_;
  summary.end = absl::Now();  // the steps' time, without the measurement below
  if (env_.rank == 0 && peak_flops_ > 0 && device_.type == DeviceType::kCPU &&
      first_step_ < steps_) {
    // The ceiling again, now: a machine busy at the start (another job finishing) measures a low
    // one, and the MFU reads high, even above 100%. The faster measurement is the better
    // estimate of what the cores give; each step's MFU stays against the start's.
    summary.start_peak_flops = peak_flops_;
    summary.peak_flops = std::max(peak_flops_, MeasurePeakFlops(device_, DType::kF32));
  }
  summary.peak_basis = peak_basis_;
  summary.processes = env_.world_size;
  summary.threads = cfg_.threads();
  // A run resumed at (or past) its last step trains nothing: it says so, and adds no summary
  // to the metrics (the finished run's stays).
  const bool trained = first_step_ < steps_;
  RunEnd end;
  if (trained) {
    end = ReportRunSummary(*rep_, summary, totals_, result_);
  } else {
    rep_->Line(absl::StrFormat(
        "braid: nothing to train: the checkpoint is at step %d and the run has %d step(s), so it "
        "was already complete (raise --steps to train on)",
        first_step_, steps_));
  }
  std::string eval;
  if (source_->has_evaluation()) {
    BRAID_RETURN_IF_ERROR(strategy_->Evaluate([&](Module& m) { eval = source_->Evaluate(m); }));
  }
  if (!eval.empty()) rep_->Line("braid: " + eval);
  if (trained) rep_->Metric(SummaryMetricJson(eval, steps_, result_, end, mp_.get()));

  if (!cfg_.save_to().empty()) BRAID_RETURN_IF_ERROR(SaveWeights(cfg_.save_to()));
  if (!env_.log_dir.empty()) {
    result_.metrics_path = MetricsPath(env_);
    result_.log_path = LogPath(env_);
    rep_->Line(absl::StrCat("braid: metrics in ", result_.metrics_path, ", log in ", result_.log_path));
  }
  return result_;
}

}  // namespace braid::launcher::internal
