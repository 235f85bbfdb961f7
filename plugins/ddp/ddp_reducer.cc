// The "ddp" strategy's gradient reducer: buckets, readiness hooks, launching and finishing the
// bucket reductions (see ddp_reducer.h for the design and why it is apart from ddp.cc).
#include "plugins/ddp/ddp_reducer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/communicator.h"
#include "plugins/ddp/ddp_buckets.h"
#include "plugins/ddp/ddp_util.h"

namespace braid::ddp {

Reducer::Reducer(const Module::NamedTensors& params, const Options& opts, Communicator* comm,
                 std::function<void(TraceEvent)> record)
    : opts_(opts), comm_(comm), record_(std::move(record)) {
  for (const auto& [n, p] : params) {
    if (!p.requires_grad()) continue;
    Param param;
    param.name = n;
    param.tensor = p;
    params_.push_back(std::move(param));
  }
  std::vector<int> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(order.size() - 1 - i);
  BuildBuckets(order);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hook_id = params_[i].tensor.RegisterPostAccumulateGradHook(
        [this, i](Tensor&) { OnGradReady(int(i)); });
  }
}

Reducer::~Reducer() {
  for (Param& p : params_) {
    if (p.hook_id != 0) p.tensor.RemoveHook(p.hook_id);
  }
}

absl::Status Reducer::BeginStep(int64_t step) {
  step_ = step;
  if (rebuild_pending_) {
    BRAID_RETURN_IF_ERROR(RebuildBuckets());
  }
  PrepareGrads();
  comm_status_ = absl::OkStatus();
  unused_status_ = absl::OkStatus();
  peer_failed_ = false;
  step_ok_ = 1;
  return absl::OkStatus();
}

void Reducer::BuildBuckets(const std::vector<int>& order) {
  std::map<std::pair<int, std::string>, int> keys;
  std::vector<BucketableParam> sizes;
  for (const Param& p : params_) {
    auto key = std::make_pair(int(BucketDType(p.tensor)), p.tensor.device().ToString());
    int id = keys.emplace(key, int(keys.size())).first->second;
    sizes.push_back(BucketableParam{int64_t(p.tensor.nbytes()), id});
  }
  std::vector<std::vector<int>> assignment =
      AssignBuckets(sizes, order, int64_t(opts_.first_bucket_mb * (1 << 20)),
                    int64_t(opts_.bucket_cap_mb * (1 << 20)));
  buckets_.clear();
  for (auto& members : assignment) {
    Bucket b;
    b.params = std::move(members);
    const Tensor& first = params_[size_t(b.params[0])].tensor;
    b.dtype = BucketDType(first);
    b.device = first.device();
    for (size_t s = 0; s < b.params.size(); ++s) {
      Param& p = params_[size_t(b.params[s])];
      p.bucket = int(buckets_.size());
      p.slot = int(s);
      p.offset = b.numel;
      b.numel += p.tensor.numel();
    }
    b.flat = Tensor::Zeros({b.numel + int64_t(b.params.size()) + 1}, b.dtype, b.device);
    buckets_.push_back(std::move(b));
  }
}

absl::Status Reducer::RebuildBuckets() {
  const double start = NowUs();
  // Rank 0's order for everyone (ranks may see gradients become ready in different orders),
  // which Decide read with the last step's other values.
  std::vector<bool> seen(params_.size(), false);
  for (int i : agreed_order_) {
    if (i < 0 || size_t(i) >= params_.size() || seen[size_t(i)]) {
      return Error(absl::StatusCode::kInternal,
                   absl::StrCat("the bucket order broadcast from rank 0 is not a permutation of the ",
                                params_.size(), " trainable parameters (", i, " at step ", step_,
                                "): do all ranks build the same model?"));
    }
    seen[size_t(i)] = true;
  }
  BuildBuckets(agreed_order_);
  rebuilt_ = true;
  rebuild_pending_ = false;
  agreed_order_.clear();
  agreed_order_.shrink_to_fit();
  TraceEvent e;
  e.name = "rebuild_buckets";
  e.start_us = start;
  e.end_us = NowUs();
  RecordEvent(e);
  return absl::OkStatus();
}

void Reducer::PrepareGrads() {
  for (Param& p : params_) {
    p.used = false;
    if (opts_.gradient_as_bucket_view) {
      // Backward accumulates straight into the bucket: no copy in, no copy out.
      if (!GradIsBucketView(p)) p.tensor.set_grad(GradSlot(p));
    } else {
      p.tensor.ZeroGrad();
    }
  }
  if (opts_.gradient_as_bucket_view) {
    for (Bucket& b : buckets_) b.flat.Zero();
  }
}

void Reducer::BeginPass(bool sync) {
  in_pass_ = true;
  // A pass whose order did not decide the layout (its step failed) leaves nothing behind.
  if (sync && recording_order_) ready_order_.clear();
  order_on_device_ = Tensor();
  sync_pass_ = sync;
  finish_queued_ = false;
  finished_ = false;
  for (Param& p : params_) p.ready = false;
  for (Bucket& b : buckets_) {
    b.pending = int(b.params.size());
    b.work.reset();
    b.ready_us = b.launch_us = b.done_us = 0;
  }
  next_launch_ = next_done_ = 0;
}

void Reducer::OnGradReady(int index) {
  if (!in_pass_) return;  // a backward pass that is not part of a training step
  Param& p = params_[size_t(index)];
  p.used = true;
  if (!sync_pass_) {
    p.ready = true;  // accumulating locally (no_sync); nothing to communicate yet
    return;
  }
  BRAID_CHECK(!p.ready) << "gradient of " << p.tensor.DescribeForError()
                        << " reported ready twice in one backward pass";
  if (!finish_queued_) {
    finish_queued_ = true;
    autograd::QueueEndOfBackwardCallback([this] { FinishSyncPass(); });
  }
  MarkReady(index);
}

void Reducer::MarkReady(int index) {
  Param& p = params_[size_t(index)];
  p.ready = true;
  if (recording_order_) ready_order_.push_back(index);
  if (p.used) {
    if (!GradIsBucketView(p)) GradSlot(p).CopyFrom(p.tensor.grad());
  } else if (!opts_.gradient_as_bucket_view) {
    GradSlot(p).Zero();  // counts as zero (the slot still holds the previous step's average)
  }
  Bucket& b = buckets_[size_t(p.bucket)];
  if (--b.pending == 0) {
    b.ready_us = NowUs();
    LaunchReadyBuckets();
  }
}

void Reducer::LaunchReadyBuckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    // The flags (each parameter used, then this rank's step still valid) are written where the
    // bucket is, by fills: a copy from the host would make the host wait for the device (on a
    // GPU, for backward to catch up) at every bucket. Usually one fill of ones.
    Tensor flags = b.flat.FlatRange(b.numel, int64_t(b.params.size()) + 1);
    flags.Fill(1.0f);
    for (size_t s = 0; s < b.params.size(); ++s) {
      if (!params_[size_t(b.params[s])].used) flags.FlatRange(int64_t(s), 1).Fill(0.0f);
    }
    if (step_ok_ != 1.0f) flags.FlatRange(int64_t(b.params.size()), 1).Fill(step_ok_);
    b.launch_us = NowUs();
    b.work = comm_->AllReduce(b.flat, ReduceOp::kAvg);
    ++next_launch_;
  }
  PollCompleted();
}

void Reducer::PollCompleted() {
  while (next_done_ < next_launch_ && buckets_[next_done_].work->IsCompleted()) {
    buckets_[next_done_].done_us = NowUs();
    ++next_done_;
  }
}

void Reducer::MarkUnreachableReady(const Tensor& loss) {
  // As PyTorch does after forward with find_unused_parameters: parameters the loss does not
  // depend on will get no gradient, so they are ready (as zeros) before backward starts, and
  // their buckets need not wait for the end of the pass.
  std::set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  if (loss.grad_fn()) {
    seen.insert(loss.grad_fn().get());
    stack.push_back(loss.grad_fn().get());
  }
  while (!stack.empty()) {
    const autograd::Node* n = stack.back();
    stack.pop_back();
    for (const autograd::Edge& e : n->next_edges) {
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const autograd::Node* acc = params_[i].tensor.impl()->grad_accumulator.get();
    if (acc == nullptr || !seen.count(acc)) MarkReady(int(i));
  }
}

void Reducer::FinishSyncPass() {
  if (finished_) return;
  finished_ = true;
  backward_end_us_ = NowUs();
  // Parameters that got no gradient in this pass: ready now (zeros unless an earlier
  // micro-batch gave them one), in bucket order so that launches keep their sequence.
  for (const Bucket& b : buckets_) {
    for (int i : b.params) {
      if (!params_[size_t(i)].ready) MarkReady(i);
    }
  }
  BRAID_CHECK_EQ(next_launch_, buckets_.size())
      << "every bucket is launched by the end of backward";
  for (; next_done_ < buckets_.size(); ++next_done_) {
    Bucket& b = buckets_[next_done_];
    // Unpacked and read by device work only: on NCCL the compute stream waits, not the host.
    absl::Status s = b.work->WaitOnDevice();
    b.done_us = NowUs();
    if (!s.ok() && comm_status_.ok()) {
      comm_status_ = Error(s.code(), absl::StrCat("gradient reduction of bucket ", next_done_,
                                                  " in step ", step_, ": ", s.message()));
    }
  }
  if (recording_order_ && comm_status_.ok() && !buckets_.empty()) {
    // Rank 0's readiness order to every rank, on the device: written there by fills (a copy from
    // host memory would wait for the device), as f32 (exact below 2^24 parameters), and read
    // with the step's other values (Decide), which also say whether this step was clean.
    BRAID_CHECK_EQ(ready_order_.size(), params_.size()) << "every parameter is marked ready once per pass";
    BRAID_CHECK(params_.size() < (size_t(1) << 24)) << "bucket order indices must be exact in f32";
    order_on_device_ = Tensor::Empty({int64_t(params_.size())}, DType::kF32, buckets_.front().device);
    if (comm_->rank() == 0) {
      for (size_t j = 0; j < ready_order_.size(); ++j) {
        order_on_device_.FlatRange(int64_t(j), 1).Fill(float(ready_order_[j]));
      }
    } else {
      order_on_device_.Zero();  // overwritten by the broadcast
    }
    absl::Status s = comm_->Broadcast(order_on_device_, 0)->Wait();
    if (!s.ok()) {
      comm_status_ = Error(s.code(), absl::StrCat("broadcasting the bucket order in step ", step_,
                                                  ": ", s.message()));
      order_on_device_ = Tensor();
    }
  }
  waited_us_ = NowUs();
  if (comm_status_.ok()) Unpack();
  unpacked_us_ = NowUs();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    TraceEvent e;
    e.name = "allreduce";
    e.lane = Lane::kComm;
    e.bucket = int(i);
    e.bytes = b.flat.nbytes();
    e.ready_us = b.ready_us;
    e.start_us = b.launch_us;
    e.end_us = b.done_us;
    RecordEvent(e);
  }
}

void Reducer::Unpack() {
  // Every gradient copied out of its bucket (unless it is a view of it): whether some parameter
  // got no gradient on any rank is known only after the step's one read (Decide), which then
  // leaves that one undefined.
  for (Param& p : params_) {
    if (GradIsBucketView(p)) continue;
    Tensor g = p.tensor.grad();
    if (g.defined()) {
      g.CopyFrom(GradSlot(p));
    } else {
      p.tensor.set_grad(GradSlot(p).To(p.tensor.dtype()));  // a copy, rounded when f32 reduced
    }
  }
}

std::vector<Tensor> Reducer::ValuesToRead() const {
  std::vector<Tensor> out;
  for (const Bucket& b : buckets_) out.push_back(b.flags());
  if (order_on_device_.defined()) out.push_back(order_on_device_);
  return out;
}

void Reducer::Decide(const std::vector<float>& values) {
  const double n = comm_->size();
  const double all = 1.0 - 0.5 / n, none = 0.5 / n;  // thresholds on averaged 0/1 flags
  std::vector<std::string> missing;
  size_t next = 0;
  for (const Bucket& b : buckets_) {
    BRAID_CHECK(next + b.params.size() + 1 <= values.size()) << "Decide: fewer values than ValuesToRead";
    const float* flags = values.data() + next;
    next += b.params.size() + 1;
    if (flags[b.params.size()] < all) peer_failed_ = true;
    for (size_t s = 0; s < b.params.size(); ++s) {
      Param& p = params_[size_t(b.params[s])];
      const double used = flags[s];
      if (used < all && !opts_.find_unused_parameters) {
        const int ranks_without = int(std::lround((1.0 - used) * n));
        missing.push_back(absl::StrCat("'", p.name, "' (on ", ranks_without, " of ", int(n),
                                       " ranks", p.used ? "" : ", this one included", ")"));
      }
      // No rank produced a gradient: leave it undefined, as one process would, so that the
      // optimizer skips the parameter instead of decaying it on a zero gradient.
      if (used < none) p.tensor.ZeroGrad();
    }
  }
  if (!missing.empty() && !peer_failed_) {
    unused_status_ = Error(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("step ", step_, ": ", missing.size(),
                     " parameter(s) got no gradient: ", absl::StrJoin(missing, ", "),
                     ". Every parameter must contribute to the loss on every rank, or set the "
                     "strategy option find_unused_parameters=true (their gradient then counts as "
                     "zero in the average)"));
  }
  if (order_on_device_.defined()) {
    // The readiness order of the first clean step (the same verdict on every rank: peer_failed_
    // comes from the reduced flags) decides the rebuilt layout; otherwise the next step records.
    BRAID_CHECK_EQ(values.size(), next + params_.size()) << "Decide: the bucket order is missing";
    if (!peer_failed_ && comm_status_.ok()) {
      agreed_order_.clear();
      for (size_t j = 0; j < params_.size(); ++j) agreed_order_.push_back(int(std::lround(values[next + j])));
      recording_order_ = false;
      rebuild_pending_ = !rebuilt_;
      ready_order_.clear();
      ready_order_.shrink_to_fit();
    }
    order_on_device_ = Tensor();
  }
}

void Reducer::AbandonStep() {
  step_ok_ = 0;
  sync_pass_ = true;
  FinishSyncPass();
}

void Reducer::AddBucketStats(StepStats* stats) const {
  for (const Bucket& b : buckets_) {
    int64_t bytes = b.numel * int64_t(SizeOf(b.dtype));
    stats->comm_bytes += bytes;
    stats->comm_what = "gradients all-reduced";
    // The share of this bucket's reduction (launch to observed completion) that ran while
    // backward was still computing; a bucket launched at the very end hides nothing.
    double span = b.done_us - b.launch_us;
    double hidden = std::min(b.done_us, backward_end_us_) - b.launch_us;
    if (b.launch_us > 0 && span > 0 && hidden > 0) {
      stats->comm_bytes_overlapped += int64_t(double(bytes) * std::min(1.0, hidden / span));
    }
  }
}

std::vector<Tensor> Reducer::Parameters() const {
  std::vector<Tensor> out;
  for (const Param& p : params_) out.push_back(p.tensor);
  return out;
}

std::vector<BucketInfo> Reducer::Buckets() const {
  std::vector<BucketInfo> out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketInfo info;
    info.index = int(b);
    for (int i : buckets_[b].params) info.params.push_back(params_[size_t(i)].name);
    info.grad_bytes = buckets_[b].numel * int64_t(SizeOf(buckets_[b].dtype));
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace braid::ddp
