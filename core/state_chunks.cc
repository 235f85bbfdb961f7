#include "core/state_chunks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid {

int64_t RunsLength(const Runs& runs) {
  int64_t n = 0;
  for (auto& [b, e] : runs) n += e - b;
  return n;
}

StateChunk WholeChunk(const std::string& name, const Tensor& t, bool write) {
  StateChunk c;
  c.name = name;
  c.global_shape = t.shape();
  c.runs = {{0, t.numel()}};
  c.local = t;
  c.write = write;
  return c;
}

Runs MapRuns(const Runs& in_part,
             const std::function<Runs(int64_t begin, int64_t end)>& part_to_global) {
  Runs out;
  for (auto& [b, e] : in_part) {
    for (auto& r : part_to_global(b, e)) {
      // Merge adjacent runs: a whole row-split slice stays one run.
      if (!out.empty() && out.back().second == r.first) {
        out.back().second = r.second;
      } else {
        out.push_back(r);
      }
    }
  }
  return out;
}

std::vector<Overlap> Intersect(const Runs& a, const Runs& b) {
  // b's runs sorted by global position, with their local offsets, for a merge-like sweep.
  struct Run {
    int64_t begin, end, local;
  };
  std::vector<Run> sb;
  int64_t at = 0;
  for (auto& [s, e] : b) {
    sb.push_back({s, e, at});
    at += e - s;
  }
  std::sort(sb.begin(), sb.end(), [](const Run& x, const Run& y) { return x.begin < y.begin; });
  std::vector<Overlap> out;
  int64_t a_at = 0;
  for (auto& [s, e] : a) {
    // First b run that may overlap [s, e).
    auto it = std::upper_bound(sb.begin(), sb.end(), s,
                               [](int64_t v, const Run& r) { return v < r.begin; });
    if (it != sb.begin()) --it;
    for (; it != sb.end() && it->begin < e; ++it) {
      const int64_t lo = std::max(s, it->begin), hi = std::min(e, it->end);
      if (lo < hi) out.push_back({a_at + (lo - s), it->local + (lo - it->begin), hi - lo});
    }
    a_at += e - s;
  }
  return out;
}

std::vector<StateChunk> OptimizerStateChunks(
    Optimizer& optimizer, const std::function<const StateChunk*(const Tensor& param)>& chunk_of,
    bool create, bool write_step) {
  std::vector<StateChunk> out;
  std::vector<std::map<std::string, Tensor>> states = optimizer.ParameterStates(create);
  size_t k = 0;
  for (const ParamGroup& g : optimizer.param_groups()) {
    for (const Tensor& p : g.params) {
      const std::map<std::string, Tensor>& slots = states[k++];
      const StateChunk* pc = chunk_of(p);
      if (pc == nullptr) continue;
      for (auto& [slot, t] : slots) {
        BRAID_CHECK(t.numel() == RunsLength(pc->runs))
            << "optimizer state " << slot << " of " << p.DescribeForError()
            << " does not match its parameter's chunk of '" << pc->name << "'";
        StateChunk c;
        c.name = absl::StrCat("optimizer/", pc->name, "/", slot);
        c.global_shape = pc->global_shape;
        c.runs = pc->runs;
        c.local = t;
        c.write = pc->write;
        out.push_back(std::move(c));
      }
    }
  }
  // The step count as a one-element tensor the checkpointer reads and writes back.
  Tensor step = Tensor::FromVector(std::vector<float>{float(optimizer.steps_taken())}, {1});
  StateChunk s = WholeChunk("optimizer/step", step, write_step);
  out.push_back(std::move(s));
  return out;
}

void RestoreOptimizerStep(Optimizer& optimizer, const std::vector<StateChunk>& chunks) {
  for (const StateChunk& c : chunks) {
    if (c.name == "optimizer/step") optimizer.set_steps_taken(int64_t(c.local.item()));
  }
}

std::vector<StateChunk> WholeModelChunks(Module& model, Optimizer& optimizer, bool create,
                                         bool write) {
  std::vector<StateChunk> out;
  for (auto& [n, p] : model.NamedParameters()) out.push_back(WholeChunk(n, p, write));
  for (auto& [n, b] : model.NamedBuffers()) out.push_back(WholeChunk(n, b, write));
  const size_t params = out.size();
  std::vector<StateChunk> opt = OptimizerStateChunks(
      optimizer,
      [&](const Tensor& p) -> const StateChunk* {
        for (size_t i = 0; i < params; ++i) {
          if (out[i].local.SameAs(p)) return &out[i];
        }
        return nullptr;
      },
      create, write);
  out.insert(out.end(), opt.begin(), opt.end());
  return out;
}

}  // namespace braid
