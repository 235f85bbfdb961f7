#include "plugins/pipeline/schedule.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::pipeline {
namespace {

struct Work {
  int micro_batch;
  int chunk;
};

// Wraps each compute step with its communication: a forward receives its input unless its
// chunk is the first virtual stage and sends its output unless it is the last; a backward
// receives its output's gradient unless last, and sends its input's gradient unless first.
Schedule WithCommunication(const ScheduleShape& s, int stage,
                           const std::vector<std::pair<bool, Work>>& steps) {
  const int last = s.stages * s.chunks - 1;
  Schedule out;
  for (const auto& [forward, w] : steps) {
    const int virtual_stage = w.chunk * s.stages + stage;
    if (forward) {
      if (virtual_stage > 0) out.push_back({Op::kRecvActivation, w.micro_batch, w.chunk});
      out.push_back({Op::kForward, w.micro_batch, w.chunk});
      if (virtual_stage < last) out.push_back({Op::kSendActivation, w.micro_batch, w.chunk});
    } else {
      if (virtual_stage < last) out.push_back({Op::kRecvGrad, w.micro_batch, w.chunk});
      out.push_back({Op::kBackward, w.micro_batch, w.chunk});
      if (virtual_stage > 0) out.push_back({Op::kSendGrad, w.micro_batch, w.chunk});
    }
  }
  return out;
}

// `warmup` forwards, then one forward and one backward in turn, then the remaining backwards.
std::vector<std::pair<bool, Work>> OneForwardOneBackward(const std::vector<Work>& forwards,
                                                         const std::vector<Work>& backwards,
                                                         int warmup) {
  std::vector<std::pair<bool, Work>> steps;
  size_t f = 0, b = 0;
  for (; f < forwards.size() && int(f) < warmup; ++f) steps.push_back({true, forwards[f]});
  while (f < forwards.size()) {
    steps.push_back({true, forwards[f++]});
    steps.push_back({false, backwards[b++]});
  }
  while (b < backwards.size()) steps.push_back({false, backwards[b++]});
  return steps;
}

std::vector<Work> InOrder(int m) {
  std::vector<Work> w;
  for (int i = 0; i < m; ++i) w.push_back({i, 0});
  return w;
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kRecvActivation: return "recv-activation";
    case Op::kForward: return "forward";
    case Op::kSendActivation: return "send-activation";
    case Op::kRecvGrad: return "recv-grad";
    case Op::kBackward: return "backward";
    case Op::kSendGrad: return "send-grad";
    case Op::kWeightGrad: return "weight-grad";
  }
  return "?";
}

Schedule SplitBackward(const Schedule& schedule) {
  Schedule out;
  for (size_t i = 0; i < schedule.size(); ++i) {
    const Action& a = schedule[i];
    out.push_back(a);
    const bool sends_after = i + 1 < schedule.size() && schedule[i + 1].op == Op::kSendGrad &&
                             schedule[i + 1].micro_batch == a.micro_batch &&
                             schedule[i + 1].chunk == a.chunk;
    if ((a.op == Op::kBackward && !sends_after) || a.op == Op::kSendGrad) {
      out.push_back({Op::kWeightGrad, a.micro_batch, a.chunk});
    }
  }
  return out;
}

Schedule GPipe(const ScheduleShape& s, int stage) {
  return WithCommunication(s, stage, OneForwardOneBackward(InOrder(s.micro_batches),
                                                           InOrder(s.micro_batches),
                                                           s.micro_batches));
}

Schedule OneFOneB(const ScheduleShape& s, int stage) {
  const int warmup = std::min(s.stages - stage - 1, s.micro_batches);
  return WithCommunication(s, stage, OneForwardOneBackward(InOrder(s.micro_batches),
                                                           InOrder(s.micro_batches), warmup));
}

Schedule Interleaved(const ScheduleShape& s, int stage) {
  // Megatron's order: micro-batches in groups of P, each group through chunk 0, then chunk 1, ...
  // forward; backward the same groups through the chunks in reverse.
  const int p = s.stages, v = s.chunks, total = s.micro_batches * v;
  std::vector<Work> forwards, backwards;
  for (int i = 0; i < total; ++i) {
    const int group = i / (p * v), in_group = i % (p * v);
    const int chunk = in_group / p, mb = group * p + in_group % p;
    forwards.push_back({mb, chunk});
    backwards.push_back({mb, v - 1 - chunk});
  }
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  return WithCommunication(s, stage, OneForwardOneBackward(forwards, backwards, warmup));
}

absl::StatusOr<Schedule> MakeSchedule(const std::string& name, const ScheduleShape& s, int stage) {
  if (s.stages < 1 || s.micro_batches < 1 || s.chunks < 1 || stage < 0 || stage >= s.stages) {
    return absl::InvalidArgumentError(absl::StrCat("bad pipeline shape: ", s.stages, " stages, ",
                                                   s.micro_batches, " micro-batches, ", s.chunks,
                                                   " chunks, stage ", stage));
  }
  if (name != "interleaved" && s.chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule '", name, "' runs one model chunk per stage; virtual_stages ", s.chunks,
        " needs schedule 'interleaved'"));
  }
  if (name == "gpipe") return GPipe(s, stage);
  if (name == "1f1b") {
    if (s.micro_batches < s.stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule '1f1b' needs at least as many micro-batches per step as stages: ",
          s.micro_batches, " < ", s.stages,
          "; raise gradient_accumulation_steps (the micro-batches per step) or use 'gpipe'"));
    }
    return OneFOneB(s, stage);
  }
  if (name == "interleaved") {
    if (s.micro_batches % s.stages != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule 'interleaved' needs the micro-batches per step (", s.micro_batches,
          ") to be a multiple of the stages (", s.stages,
          "); set gradient_accumulation_steps accordingly"));
    }
    return Interleaved(s, stage);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name, "'; known: gpipe, 1f1b, interleaved"));
}

double BubbleFormula(const std::string& name, const ScheduleShape& s) {
  double p = s.stages, m = s.micro_batches, v = name == "interleaved" ? s.chunks : 1;
  return (p - 1) / v / (m + (p - 1) / v);
}

double SpanOfStep(const std::vector<float>& e, const std::vector<float>& r,
                  const std::vector<float>& s) {
  const size_t p = e.size();
  if (p == 1) return e[0];
  double beyond_send = e[p - 1] - s[p - 1];  // of stage p-1's end, past its last send
  for (size_t k = p - 2; k >= 1; --k) beyond_send = std::max<double>(e[k], r[k] + beyond_send) - s[k];
  return std::max<double>(e[0], r[0] + beyond_send);
}

std::vector<size_t> ReceivesPostedAt(const Schedule& schedule, size_t at, int ahead) {
  std::vector<size_t> out;
  int computes = 0;  // forwards and backwards in [at, j)
  for (size_t j = at; j < schedule.size() && computes <= ahead; ++j) {
    const Op op = schedule[j].op;
    if (op == Op::kForward || op == Op::kBackward) ++computes;  // W posts and waits for nothing
    if (op == Op::kRecvActivation || op == Op::kRecvGrad) out.push_back(j);
  }
  return out;
}

std::string ToString(const Schedule& schedule) {
  std::vector<std::string> parts;
  for (const Action& a : schedule) {
    const char* c = "?";
    switch (a.op) {
      case Op::kRecvActivation: c = "r"; break;
      case Op::kForward: c = "F"; break;
      case Op::kSendActivation: c = "s"; break;
      case Op::kRecvGrad: c = "rg"; break;
      case Op::kBackward: c = "B"; break;
      case Op::kSendGrad: c = "sg"; break;
      case Op::kWeightGrad: c = "W"; break;
    }
    parts.push_back(a.chunk ? absl::StrCat(c, a.micro_batch, ".", a.chunk) : absl::StrCat(c, a.micro_batch));
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace braid::pipeline
