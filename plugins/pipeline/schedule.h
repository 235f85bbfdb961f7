// Pipeline schedules as data: for each rank, the list of actions it performs in one training
// step. The executor (pipeline.cc) runs any such list, so a new schedule is a new function
// here, not a change to the executor (docs/WRITING_A_STRATEGY.md, "Writing a schedule").
//
// Stages are numbered 0..P-1 and each rank (a pipeline stage) may hold v model chunks: chunk c
// of rank s is virtual stage c*P + s, and activations flow from virtual stage k to k+1.
#ifndef BRAID_PLUGINS_PIPELINE_SCHEDULE_H_
#define BRAID_PLUGINS_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::pipeline {

enum class Op {
  kRecvActivation,  // post the receive of the micro-batch's input from the previous stage
  kForward,         // forward the chunk on the micro-batch (the first stage loads it)
  kSendActivation,  // send the chunk's output to the next stage
  kRecvGrad,        // post the receive of the output's gradient from the next stage
  kBackward,        // backward of the chunk (the last stage starts from the loss)
  kSendGrad,        // send the input's gradient to the previous stage
  kWeightGrad,      // the weights' gradients of a backward that put them off (SplitBackward)
};
const char* OpName(Op op);

struct Action {
  Op op;
  int micro_batch;
  int chunk = 0;  // which of this rank's model chunks (interleaved schedules)
  bool operator==(const Action& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};
using Schedule = std::vector<Action>;

struct ScheduleShape {
  int stages = 1;          // P: ranks in the pipeline
  int micro_batches = 1;   // m, per step
  int chunks = 1;          // v: model chunks per rank (1 unless interleaved)
};

// GPipe: all forwards, then all backwards (each stage holds m micro-batches' activations).
Schedule GPipe(const ScheduleShape& s, int stage);
// 1F1B (PipeDream-flush): P-1-stage forwards to fill, then one forward one backward, then the
// remaining backwards (at most P micro-batches' activations per stage). Needs m >= P.
Schedule OneFOneB(const ScheduleShape& s, int stage);
// Interleaved 1F1B (Megatron): v chunks per rank, micro-batches in groups of P; the bubble
// shrinks by v. Needs m to be a multiple of P.
Schedule Interleaved(const ScheduleShape& s, int stage);

// `schedule` with each backward split in two (zero-bubble schedules' B and W): the backward
// computes only its input's gradient, and the weights' gradients (W) follow after the input's
// gradient has been sent, or right after the backward on the first stage, which sends none. The
// previous stage gets its gradient earlier by the weights' share of the backward, which at the
// end of a step lets it start its last backwards that much sooner.
Schedule SplitBackward(const Schedule& schedule);

// By name ("gpipe", "1f1b", "interleaved"), checking the shape; errors say what to change.
absl::StatusOr<Schedule> MakeSchedule(const std::string& name, const ScheduleShape& s, int stage);

// The bubble fraction each schedule has when every forward and backward of a chunk takes the
// same time: (P-1)/(m+P-1), divided by v for the interleaved schedule.
double BubbleFormula(const std::string& name, const ScheduleShape& s);

// The receives an executor posts on reaching action `at`: those with at most `ahead` forwards
// and backwards between `at` and them (ahead = 0 posts each where the list puts it). Posting a
// receive before its message is sent lets the message move as soon as it is sent (Gloo and NCCL
// match the two sides first). Indices into `schedule`, in order.
std::vector<size_t> ReceivesPostedAt(const Schedule& schedule, size_t at, int ahead);

// A step's span in stage 0's clock, from what each stage measured in its own (times relative to
// its own first compute): `e` its last compute's end, `r` when its last gradient arrived, `s`
// when it sent its last gradient. Ranks share no clock, but stage k+1's last gradient send and
// stage k's receipt of it are one moment (give or take the message's latency, which this counts
// as span: the bubble errs high), so stage k+1's end lies `e - s` after stage k's `r`. Without
// split backwards every stage ends before it sends its last gradient, and this is stage 0's last
// backward; with them a later stage's last weight gradients may end after it.
double SpanOfStep(const std::vector<float>& e, const std::vector<float>& r,
                  const std::vector<float>& s);

std::string ToString(const Schedule& schedule);  // "F0 S0 F1 S1 R0 B0 ...", for messages

}  // namespace braid::pipeline

#endif  // BRAID_PLUGINS_PIPELINE_SCHEDULE_H_
