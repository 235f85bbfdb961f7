// What the "ddp" strategy exposes beyond core/strategy.h: its per-step timeline and its bucket
// layout, so that tests and tools can check overlap from recorded events rather than from
// timing, and see which parameters share a reduction.
//
// The strategy object made by Registry::Get().MakeStrategy("ddp") also implements DdpIntrospection:
//   auto* ddp = dynamic_cast<braid::ddp::DdpIntrospection*>(strategy.get());
// Header-only on purpose: the class lives in libbraid_ddp.so and callers never link the plugin.
#ifndef BRAID_PLUGINS_DDP_DDP_TRACE_H_
#define BRAID_PLUGINS_DDP_DDP_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace braid::ddp {

// Where an event happened: the rank's own thread (forward, backward, waits, optimizer) or the
// communicator (one event per bucket reduction).
enum class Lane { kCompute = 0, kComm = 1 };

// One interval of one step. Times are microseconds since the Unix epoch (absl::Now), so the
// traces of several processes on synchronised clocks line up.
struct TraceEvent {
  // Compute lane: "setup", "rebuild_buckets", "forward", "backward", "wait_comm", "optimizer".
  // Comm lane: "allreduce".
  std::string name;
  Lane lane = Lane::kCompute;
  int64_t step = -1;     // 0-based TrainStep index; -1 for setup
  int micro_batch = -1;  // forward/backward only
  int bucket = -1;       // allreduce only: the bucket's index in the layout of that step
  int64_t bytes = 0;     // allreduce only: bytes reduced (gradients plus flags)
  double start_us = 0;   // allreduce: when it was launched
  double end_us = 0;     // allreduce: when it was first seen complete (an upper bound)
  double ready_us = 0;   // allreduce only: when the bucket's last gradient was ready
};

struct BucketInfo {
  int index = 0;
  std::vector<std::string> params;  // in the bucket's flat order
  int64_t grad_bytes = 0;
};

class DdpIntrospection {
 public:
  virtual ~DdpIntrospection() = default;
  // Events of the most recent steps (option trace_steps, default 10) plus setup, oldest first.
  // Call between steps, from the thread that runs them.
  virtual std::vector<TraceEvent> TraceEvents() const = 0;
  // The bucket layout the next step will use (bucket 0 is reduced first).
  virtual std::vector<BucketInfo> Buckets() const = 0;
  // Whether the layout was rebuilt from the order gradients became ready in the first step.
  virtual bool BucketsRebuilt() const = 0;
};

}  // namespace braid::ddp

#endif  // BRAID_PLUGINS_DDP_DDP_TRACE_H_
