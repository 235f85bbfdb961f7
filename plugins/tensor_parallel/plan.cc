#include "plugins/tensor_parallel/plan.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/check.h"
#include "core/deferred_init.h"
#include "core/ops.h"
#include "core/registry.h"

namespace braid::tensor_parallel {
namespace {

const char* StyleName(Style s) {
  switch (s) {
    case Style::kColwise: return "colwise";
    case Style::kRowwise: return "rowwise";
    case Style::kVocabEmbedding: return "vocab_embedding";
    case Style::kSequenceSlice: return "sequence_slice";
  }
  return "?";
}

bool Matches(const std::string& pattern, const std::string& name) {
  std::vector<std::string> p = absl::StrSplit(pattern, '.');
  std::vector<std::string> n = absl::StrSplit(name, '.');
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != "*" && p[i] != n[i]) return false;
  }
  return true;
}

// Own parameters of a module (not its children's), by local name.
std::map<std::string, Tensor> OwnParameters(Module& m) {
  std::map<std::string, Tensor> own;
  for (auto& [name, t] : m.NamedParameters()) {
    if (name.find('.') == std::string::npos) own[name] = t;
  }
  return own;
}

}  // namespace

absl::StatusOr<Plan> ParsePlan(const std::string& text, const std::string& origin) {
  Plan plan;
  plan.name = origin;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    for (std::string& w : words) w = std::string(absl::StripAsciiWhitespace(w));
    if (words.empty()) continue;
    auto where = [&] { return absl::StrCat("tensor-parallel plan ", origin, " line ", line_no, ": "); };
    if (words[0] == "output") {
      if (words.size() != 2 || words[1] != "vocab_sharded") {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "'output' takes one word: vocab_sharded"));
      }
      plan.output_vocab_sharded = true;
      continue;
    }
    if (words[0] == "divides") {
      if (words.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "'divides' takes one model field or option (n_head, n_kv_head, ...)"));
      }
      plan.divides.push_back(words[1]);
      continue;
    }
    if (words[0] == "sequence_dim") {
      if (words.size() != 2 || words[1] != "1") {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "'sequence_dim' takes 1 (activations [B, T, ...]); no other layout is supported"));
      }
      plan.sequence_dim_declared = true;
      continue;
    }
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "'", words[0], "' has no style; write '<module pattern> <style>'"));
    }
    Rule rule;
    rule.pattern = words[0];
    rule.line = line_no;
    if (words[1] == "colwise") {
      rule.style = Style::kColwise;
    } else if (words[1] == "rowwise") {
      rule.style = Style::kRowwise;
    } else if (words[1] == "vocab_embedding") {
      rule.style = Style::kVocabEmbedding;
    } else if (words[1] == "sequence_slice") {
      rule.style = Style::kSequenceSlice;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "unknown style '", words[1],
          "' (known: colwise, rowwise, vocab_embedding, sequence_slice)"));
    }
    for (size_t i = 2; i < words.size(); ++i) {
      absl::string_view w = words[i];
      if (absl::ConsumePrefix(&w, "chunks=") && rule.style == Style::kColwise &&
          absl::SimpleAtoi(w, &rule.chunks) && rule.chunks >= 1) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "'", words[i], "' is not an option of ", words[1],
          rule.style == Style::kColwise ? " (it takes chunks=K, K >= 1)" : " (it takes none)"));
    }
    plan.rules.push_back(rule);
  }
  if (plan.rules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel plan ", origin, " has no rules"));
  }
  return plan;
}

absl::StatusOr<Plan> RegisteredPlan(const std::string& model) {
  absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel(model);
  if (!spec.ok()) {
    return absl::NotFoundError(absl::StrCat("no model '", model, "' is registered to take its tensor-parallel plan "
                                            "from; name a registered model or a plan file"));
  }
  if (spec->tensor_plan.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "model '", model, "' registers no tensor-parallel plan; write one (docs/WRITING_A_STRATEGY.md, "
        "\"Writing a plan\") and name its file in parallel.tensor_plan, or give it in the model's "
        "registration (ModelSpec::tensor_plan)"));
  }
  return ParsePlan(spec->tensor_plan, model);
}

absl::StatusOr<Plan> LoadPlan(const std::string& spec) {
  if (spec.find('/') == std::string::npos && spec.find('.') == std::string::npos) {
    return RegisteredPlan(spec);
  }
  std::ifstream in(spec);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("tensor-parallel plan file '", spec, "' cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParsePlan(text.str(), spec);
}

Tensor SliceForRank(const Tensor& full, const ShardSpec& spec, int rank, int size) {
  std::vector<float> v = full.ToFloatVector();
  std::vector<float> out;
  Shape shape = full.shape();
  if (spec.dim == 0) {
    const int64_t rows = shape[0], inner = full.numel() / std::max<int64_t>(rows, 1);
    const int64_t chunk = rows / spec.chunks, part = chunk / size;
    for (int j = 0; j < spec.chunks; ++j) {
      const int64_t first = j * chunk + rank * part;
      out.insert(out.end(), v.begin() + first * inner, v.begin() + (first + part) * inner);
    }
    shape[0] = part * spec.chunks;
  } else {
    const int64_t rows = shape[0], cols = shape[1], part = cols / size;
    for (int64_t r = 0; r < rows; ++r) {
      out.insert(out.end(), v.begin() + r * cols + rank * part, v.begin() + r * cols + (rank + 1) * part);
    }
    shape[1] = part;
  }
  return Tensor::FromVector(out, shape, full.device()).To(full.dtype());
}

Runs PartToFull(const ShardSpec& spec, int rank, int size, int64_t begin, int64_t end) {
  const Shape& full = spec.full_shape;
  Runs out;
  if (spec.dim == 0) {
    const int64_t inner = NumElements(full) / std::max<int64_t>(full[0], 1);
    const int64_t chunk = full[0] / spec.chunks, part = chunk / size;
    const int64_t per_chunk = part * inner;  // elements of one chunk in this rank's part
    for (int64_t i = begin; i < end;) {
      const int64_t j = i / per_chunk, within = i % per_chunk;
      const int64_t len = std::min(end - i, per_chunk - within);
      const int64_t at = (j * chunk + int64_t(rank) * part) * inner + within;
      out.push_back({at, at + len});
      i += len;
    }
  } else {
    const int64_t cols = full[1], part = cols / size;
    for (int64_t i = begin; i < end;) {
      const int64_t row = i / part, col = i % part;
      const int64_t len = std::min(end - i, part - col);
      const int64_t at = row * cols + int64_t(rank) * part + col;
      out.push_back({at, at + len});
      i += len;
    }
  }
  return out;
}

absl::StatusOr<Tensor> GatherFromGroup(const Tensor& local, const ShardSpec& spec,
                                       Communicator& group) {
  const int size = group.size();
  Tensor flat = local.Detach().Clone().Reshape({local.numel()});
  Tensor all = Tensor::Empty({local.numel() * size}, local.dtype(), local.device());
  BRAID_RETURN_IF_ERROR(group.AllGather(flat, all)->Wait());
  std::vector<float> v = all.ToFloatVector();
  std::vector<float> out(v.size());
  const Shape& full = spec.full_shape;
  const int64_t per_rank = local.numel();
  if (spec.dim == 0) {
    const int64_t inner = NumElements(full) / std::max<int64_t>(full[0], 1);
    const int64_t chunk = full[0] / spec.chunks, part = chunk / size;
    for (int r = 0; r < size; ++r) {
      for (int j = 0; j < spec.chunks; ++j) {
        const float* src = v.data() + r * per_rank + j * part * inner;
        std::copy(src, src + part * inner, out.begin() + (j * chunk + r * part) * inner);
      }
    }
  } else {
    const int64_t rows = full[0], cols = full[1], part = cols / size;
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < rows; ++i) {
        const float* src = v.data() + r * per_rank + i * part;
        std::copy(src, src + part, out.begin() + i * cols + r * part);
      }
    }
  }
  return Tensor::FromVector(out, full, local.device()).To(local.dtype());
}

absl::StatusOr<ShardMap> ApplyPlan(Module& model, const Plan& plan, Communicator& group,
                                   CommCounters* counters, bool sequence_parallel) {
  const int size = group.size(), rank = group.rank();
  if (sequence_parallel && !plan.sequence_dim_declared) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel plan ", plan.name, " does not declare `sequence_dim 1`, so sequence "
        "parallelism cannot split its activations; turn parallel.sequence_parallel off"));
  }
  const bool sp = sequence_parallel && size > 1;
  struct Change {
    Module* module;
    std::string name;
    const Rule* rule;
  };
  std::vector<Change> changes;
  ShardMap shards;
  std::map<std::string, std::string> owner;  // module name -> rule, to catch overlaps
  auto modules = model.NamedModules();
  for (const Rule& rule : plan.rules) {
    int matched = 0;
    const std::string what = absl::StrCat("tensor-parallel plan ", plan.name, " line ", rule.line,
                                          " (", rule.pattern, " ", StyleName(rule.style), ")");
    for (auto& [name, m] : modules) {
      if (name.empty() || !Matches(rule.pattern, name)) continue;
      ++matched;
      if (owner.count(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": module '", name, "' is matched by another rule too"));
      }
      owner[name] = rule.pattern;
      std::map<std::string, Tensor> own = OwnParameters(*m);
      auto need_weight = [&](int ndim) -> absl::Status {
        auto it = own.find("weight");
        if (it == own.end() || it->second.ndim() != ndim) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": module '", name, "' (", m->type_name(), ") has no ", ndim,
              "-D parameter 'weight' to split"));
        }
        if (!it->second.has_data() && !IsDeferred(it->second)) {
          return absl::FailedPreconditionError(absl::StrCat(
              what, ": '", name, ".weight' has no values (released by a strategy?); tensor "
              "parallelism splits parameters from their full initial values"));
        }
        return absl::OkStatus();
      };
      auto divides = [&](const std::string& param, int64_t n, int64_t by) -> absl::Status {
        if (n % by == 0) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": '", name, ".", param, "' has ", n, " along the split dimension, which ",
            by, " (", rule.chunks > 1 ? absl::StrCat(rule.chunks, " chunks x ") : "", size,
            " ranks) does not divide; choose a tensor size that divides it"));
      };
      if (rule.style == Style::kColwise) {
        for (const char* p : {"weight", "bias"}) {
          auto it = own.find(p);
          if (it == own.end()) continue;
          BRAID_RETURN_IF_ERROR(divides(p, it->second.size(0), int64_t(rule.chunks) * size));
          shards[absl::StrCat(name, ".", p)] = {0, rule.chunks, it->second.shape()};
        }
      } else if (rule.style == Style::kRowwise) {
        BRAID_RETURN_IF_ERROR(need_weight(2));
        BRAID_RETURN_IF_ERROR(divides("weight", own["weight"].size(1), size));
        shards[name + ".weight"] = {1, 1, own["weight"].shape()};
      } else if (rule.style == Style::kVocabEmbedding) {
        BRAID_RETURN_IF_ERROR(need_weight(2));
        BRAID_RETURN_IF_ERROR(divides("weight", own["weight"].size(0), size));
        shards[name + ".weight"] = {0, 1, own["weight"].shape()};
      }  // sequence_slice splits no parameter
      changes.push_back({m, name, &rule});
    }
    if (matched == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " matches no module of the model (", model.type_name(),
          "); module names look like 'h.0.mlp.c_fc'"));
    }
  }
  // Everything checked: now split in place and rewrite the forwards.
  Communicator* g = &group;
  for (auto& [name, p] : model.NamedParameters()) {
    auto it = shards.find(name);
    if (it == shards.end()) {
      p.set_grad_norm_share(1.0f / float(size));  // replicated: counted once over the group
      if (sp) {
        // It sees only this rank's part of the sequence: its gradient is a partial sum until
        // summed over the group, done as each gradient arrives so that .grad is always whole.
        p.RegisterGradTransform([g, counters](const Tensor& grad) {
          Tensor sum = SumOverGroup(grad.Detach(), *g, "summing a replicated weight's gradient");
          if (counters != nullptr) counters->backward_bytes += int64_t(sum.nbytes());
          return sum;
        });
      }
      continue;
    }
    // A deferred parameter (the layer below is ZeRO-3, core/deferred_init.h) gets its full
    // initial values for as long as slicing takes: one whole parameter at a time, never the
    // whole model. Its slice is then materialised, which the layer below shards in turn.
    if (IsDeferred(p)) braid::Materialize(p);
    p.RebindToPart(SliceForRank(p.Detach(), it->second, rank, size));
  }
  for (const Change& c : changes) {
    Module* m = c.module;
    std::map<std::string, Tensor> own = OwnParameters(*m);
    switch (c.rule->style) {
      case Style::kColwise:
        m->ReplaceForward([m, g, counters, sp](const Tensor& x) {
          return m->Forward(sp ? GatherSequence(x, *g, counters) : CopyToGroup(x, *g, counters));
        });
        break;
      case Style::kRowwise: {
        Tensor w = own["weight"];
        Tensor b = own.count("bias") ? own["bias"] : Tensor();
        m->ReplaceForward([w, b, g, counters, sp](const Tensor& x) {
          Tensor partial = ops::Linear(x, w, Tensor());
          Tensor y = sp ? ScatterSequence(partial, *g, counters) : ReduceFromGroup(partial, *g, counters);
          return b.defined() ? ops::Add(y, b) : y;
        });
        break;
      }
      case Style::kVocabEmbedding: {
        Tensor w = own["weight"];
        const int64_t start = int64_t(rank) * w.size(0);
        m->ReplaceForward([w, start, g, counters, sp](const Tensor& ids) {
          return VocabParallelEmbedding(w, ids, start, *g, counters, sp);
        });
        break;
      }
      case Style::kSequenceSlice: {
        if (!sp) break;  // only sequence parallelism splits the sequence
        const int r = rank, t = size;
        m->ReplaceForward([m, r, t](const Tensor& x) {
          Tensor full = m->Forward(x);
          BRAID_CHECK(full.size(0) % t == 0)
              << "sequence parallelism: the sequence length " << full.size(0)
              << " is not a multiple of the tensor-parallel size " << t
              << "; use a context length the tensor size divides";
          const int64_t rows = full.size(0) / t;
          return full.Slice(r * rows, (r + 1) * rows);
        });
        break;
      }
    }
  }
  return shards;
}

}  // namespace braid::tensor_parallel
