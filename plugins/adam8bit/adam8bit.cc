#include "plugins/adam8bit/adam8bit.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/kernels.h"
#include "core/optimizer_state.h"
#include "plugins/adam8bit/adam8bit_info.h"
#include "plugins/adam8bit/blockwise.h"

namespace braid::adam8bit {
namespace {

constexpr char kStepKey[] = "step";
// The two moments: slot names as PyTorch's (and core's AdamW) name them, and their maps.
constexpr const char* kSlots[2] = {"exp_avg", "exp_avg_sq"};
constexpr const char* kMapKeys[2] = {"quant_map.signed", "quant_map.unsigned"};
const QuantMap& MapOf(int moment) { return moment == 0 ? SignedMap() : UnsignedMap(); }

// Values dequantized, updated and requantized at a time: whole blocks, so a chunk's absmax are
// its own, and few enough that the f32 scratch (2 x 256 KiB) stays small next to the states.
constexpr int64_t kChunk = 32 * kBlockSize;

// One moment of one parameter. Either 32-bit (`f32`, exactly AdamW's slot) or 8-bit (`codes`,
// u8 shaped like the parameter, indices into MapOf(moment); `absmax`, one f32 per block).
// `staged` is an f32 copy of an 8-bit moment handed out by ParameterStates: whoever holds it may
// write into it (a checkpoint being loaded), so it is the moment's truth until the next Step
// quantizes it back and drops it.
struct Moment {
  Tensor f32;
  Tensor codes, absmax;
  Tensor staged;
};

struct ParamState {
  bool created = false;
  bool quantized = false;
  Moment moment[2];  // exp_avg (m), exp_avg_sq (v)
};

// `t` as a host tensor of `dtype` (itself when it already is one).
Tensor OnHost(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.device().type == DeviceType::kCPU) return t;
  Tensor out = Tensor::Empty(t.shape(), dtype, Device::CPU());
  out.CopyFrom(t);
  return out;
}

Tensor MapTensor(int moment) {
  const QuantMap& map = MapOf(moment);
  return Tensor::FromVector(std::vector<float>(map.code.begin(), map.code.end()), {kCodes});
}

class Adam8bit final : public Optimizer, public Adam8bitInfo {
 public:
  Adam8bit(std::vector<ParamGroup> groups, Adam8bitOptions opts)
      : Optimizer(std::move(groups)), opts_(opts) {}

  std::string name() const override { return "Adam8bit"; }

  void Step() override {
    SyncState();
    ++step_;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParamGroup& group = groups_[g];
      // A schedule's betas (OneCycle's momentum) when it set them.
      const kernels::AdamWParams params{group.lr,
                                        group.beta1 >= 0.0f ? group.beta1 : opts_.beta1,
                                        group.beta2 >= 0.0f ? group.beta2 : opts_.beta2,
                                        opts_.eps,
                                        group.weight_decay,
                                        step_};
      for (size_t i = 0; i < group.params.size(); ++i) {
        Tensor p = group.params[i];
        Tensor grad = GradOf(p);
        if (!grad.defined()) continue;
        ParamState& st = Create(g, i);
        if (!st.quantized) {
          // The same kernel on the same f32 slots as core's AdamW: bit-identical updates.
          kernels::adamw.Get(p.device())(p, grad, st.moment[0].f32, st.moment[1].f32, params);
        } else {
          for (int k = 0; k < 2; ++k) Commit(st.moment[k], k);
          Step8bit(p, grad, st, params);
        }
      }
    }
    if (!reported_) {
      // One line per process, so that a run's log says what the optimizer holds.
      reported_ = true;
      const StateBytes b = state_bytes();
      std::fprintf(stderr,
                   "braid: Adam8bit: optimizer state %lld bytes (%.2f MiB) for %lld parameters "
                   "(%.3f B/param; 8-bit states for %lld tensors, 32-bit for %lld%s)\n",
                   static_cast<long long>(b.bytes), double(b.bytes) / (1 << 20),
                   static_cast<long long>(b.parameters), b.per_parameter(),
                   static_cast<long long>(b.tensors_8bit), static_cast<long long>(b.tensors_32bit),
                   KeptByNameNote().c_str());
    }
  }

  // What the optimizer holds, as it holds it (the optimizer's own tensors, as AdamW's state dict
  // is; nothing dequantized): "<param>.<slot>" (f32) for 32-bit moments,
  // "<param>.<slot>.codes" (u8, the parameter's shape) and "<param>.<slot>.absmax" (f32, one per
  // block of 2048) for 8-bit ones, the two maps the codes index ("quant_map.signed",
  // "quant_map.unsigned", 256 f32 each, checked on load) and "step". A staged moment is
  // quantized into fresh tensors first. LoadStateDict also takes f32 moments for any parameter
  // (an AdamW state dict loads into Adam8bit).
  std::map<std::string, Tensor> StateDict() const override {
    std::map<std::string, Tensor> out;
    out[kStepKey] = Tensor::FromVector(std::vector<int64_t>{step_}, {});
    for (int k = 0; k < 2; ++k) out[kMapKeys[k]] = MapTensor(k);
    const auto keys = Keys();
    for (size_t g = 0; g < state_.size(); ++g) {
      for (size_t i = 0; i < state_[g].size(); ++i) {
        const ParamState& st = state_[g][i];
        if (!st.created) continue;
        for (int k = 0; k < 2; ++k) {
          const std::string key = absl::StrCat(keys[g][i], ".", kSlots[k]);
          const Moment& m = st.moment[k];
          if (!st.quantized) {
            out[key] = m.f32;
            continue;
          }
          Moment q = m;
          if (m.staged.defined()) {
            q.codes = Tensor::Empty(m.codes.shape(), DType::kU8, m.codes.device());
            q.absmax = Tensor::Empty(m.absmax.shape(), DType::kF32, m.absmax.device());
            Commit(q, k);
          }
          out[key + ".codes"] = q.codes;
          out[key + ".absmax"] = q.absmax;
        }
      }
    }
    return out;
  }

  absl::Status LoadStateDict(const std::map<std::string, Tensor>& state) override {
    SyncState();
    BRAID_RETURN_IF_ERROR(CheckStateDict(state));
    const Tensor& step = state.at(kStepKey);
    step_ = step.dtype() == DType::kI64 ? OnHost(step, DType::kI64).data<int64_t>()[0]
                                        : int64_t(step.item());
    const auto keys = Keys();
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        const std::string base = absl::StrCat(keys[g][i], ".", kSlots[0]);
        if (!state.count(base) && !state.count(base + ".codes")) {  // never stepped when saved
          state_[g][i] = ParamState();
          continue;
        }
        ParamState& st = Create(g, i);
        for (int k = 0; k < 2; ++k) {
          const std::string key = absl::StrCat(keys[g][i], ".", kSlots[k]);
          Moment& m = st.moment[k];
          m.staged = Tensor();
          auto f32 = state.find(key);
          if (f32 != state.end()) {  // f32 values: stored as this optimizer stores the moment
            if (st.quantized) {
              Quantize(MapOf(k), OnHost(f32->second, DType::kF32).data<float>(), m.codes.numel(),
                       m.codes.data<uint8_t>(), m.absmax.data<float>());
            } else {
              m.f32.CopyFrom(f32->second);
            }
            continue;
          }
          const Tensor codes = OnHost(state.at(key + ".codes"), DType::kU8);
          const Tensor absmax = OnHost(state.at(key + ".absmax"), DType::kF32);
          if (st.quantized) {  // the same blocks: taken as they are, bit for bit
            m.codes.CopyFrom(codes);
            m.absmax.CopyFrom(absmax);
          } else {
            Tensor values = Tensor::Empty(codes.shape(), DType::kF32, Device::CPU());
            Dequantize(MapOf(k), codes.data<uint8_t>(), absmax.data<float>(), codes.numel(),
                       values.data<float>());
            m.f32.CopyFrom(values);
          }
        }
      }
    }
    return absl::OkStatus();
  }

  // For sharded checkpoints (core/state_chunks.h), which want f32 tensors that alias the state.
  // 32-bit moments are returned as they are. 8-bit moments are staged: dequantized into f32
  // tensors the optimizer keeps, which are then the state (a checkpoint may read them or write
  // into them) until the next Step quantizes them back. Saving therefore costs 8 bytes per
  // parameter of 8-bit state until that step, and does not change training (requantizing what
  // was dequantized gives the same codes); loading writes into the staged tensors.
  std::vector<std::map<std::string, Tensor>> ParameterStates(bool create) override {
    SyncState();
    return PerParameterStates(groups_, [&](size_t g, size_t i) {
      std::map<std::string, Tensor> slots;
      if (create || state_[g][i].created) {
        ParamState& st = Create(g, i);
        for (int k = 0; k < 2; ++k) {
          Moment& m = st.moment[k];
          if (st.quantized && !m.staged.defined()) m.staged = Dequantized(m, k);
          slots[kSlots[k]] = st.quantized ? m.staged : m.f32;
        }
      }
      return slots;
    });
  }

  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }

  StateBytes state_bytes() const override {
    StateBytes b;
    for (const auto& group : state_) {
      for (const ParamState& st : group) {
        if (!st.created) continue;
        for (const Moment& m : st.moment) {
          b.bytes += int64_t(st.quantized ? m.codes.nbytes() + m.absmax.nbytes() : m.f32.nbytes());
        }
        b.parameters += st.quantized ? st.moment[0].codes.numel() : st.moment[0].f32.numel();
        ++(st.quantized ? b.tensors_8bit : b.tensors_32bit);
      }
    }
    return b;
  }

  bool is_8bit(int64_t index) const override {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int64_t n = int64_t(groups_[g].params.size());
      if (index >= n) {
        index -= n;
        continue;
      }
      const ParamState* st = g < state_.size() && size_t(index) < state_[g].size()
                                 ? &state_[g][size_t(index)]
                                 : nullptr;
      return st != nullptr && st->created ? st->quantized : Wants8bit(groups_[g].params[index]);
    }
    return false;
  }

  void KeepStates32bit(std::vector<Tensor> params) override { keep_32bit_ = std::move(params); }

 private:
  void SyncState() {
    state_.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) state_[g].resize(groups_[g].params.size());
  }

  bool KeptByName(const Tensor& p) const {
    return std::find(opts_.keep_32bit_names.begin(), opts_.keep_32bit_names.end(), p.name()) !=
           opts_.keep_32bit_names.end();
  }

  // "; kept 32-bit by name: wte.weight" for the large tensors the names kept, or "".
  std::string KeptByNameNote() const {
    std::vector<std::string> kept;
    for (const ParamGroup& g : groups_) {
      for (const Tensor& p : g.params) {
        if (p.numel() >= kMin8bitSize && KeptByName(p)) kept.push_back(p.name());
      }
    }
    return kept.empty() ? "" : absl::StrCat("; kept 32-bit by name: ", absl::StrJoin(kept, ", "));
  }

  // 8-bit states for large tensors only (blockwise.h, kMin8bitSize), unless kept 32-bit (by
  // identity through KeepStates32bit, or by name through Adam8bitOptions::keep_32bit_names).
  bool Wants8bit(const Tensor& p) const {
    if (p.numel() < kMin8bitSize) return false;
    if (KeptByName(p)) return false;
    for (const Tensor& t : keep_32bit_) {
      if (t.SameAs(p)) return false;
    }
    return true;
  }

  // The parameter's state, created (zero) on first use on the parameter's device.
  ParamState& Create(size_t g, size_t i) {
    ParamState& st = state_[g][i];
    if (st.created) return st;
    const Tensor& p = groups_[g].params[i];
    st.created = true;
    st.quantized = Wants8bit(p);
    if (st.quantized) {
      // The 8-bit path reads its codes on the host (a CUDA kernel for it is later work).
      BRAID_CHECK(p.device().type == DeviceType::kCPU)
          << "Adam8bit keeps 8-bit states for CPU parameters only; " << p.DescribeForError()
          << " is not on the CPU: use optimizer.type \"AdamW\" for this run";
    }
    for (Moment& m : st.moment) {
      if (!st.quantized) {
        m.f32 = Tensor::Zeros(p.shape(), DType::kF32, p.device());
        continue;
      }
      // Codes of 0 with an absmax of 0 dequantize to 0: a zero state, as AdamW starts from.
      m.codes = Tensor::Zeros(p.shape(), DType::kU8, p.device());
      m.absmax = Tensor::Zeros({NumBlocks(p.numel())}, DType::kF32, p.device());
    }
    return st;
  }

  // A staged moment becomes codes again (into m.codes and m.absmax) and is dropped.
  static void Commit(Moment& m, int moment) {
    if (!m.staged.defined()) return;
    Quantize(MapOf(moment), m.staged.data<float>(), m.staged.numel(), m.codes.data<uint8_t>(),
             m.absmax.data<float>());
    m.staged = Tensor();
  }

  // The f32 values of an 8-bit moment, shaped like the parameter.
  static Tensor Dequantized(const Moment& m, int moment) {
    Tensor out = Tensor::Empty(m.codes.shape(), DType::kF32, m.codes.device());
    Dequantize(MapOf(moment), m.codes.data<uint8_t>(), m.absmax.data<float>(), m.codes.numel(),
               out.data<float>());
    return out;
  }

  // One AdamW step of an 8-bit parameter, a chunk of whole blocks at a time: dequantize both
  // moments into f32 scratch, run the backend's own AdamW kernel on them (so the arithmetic is
  // AdamW's to the bit; only what is stored between steps is 8-bit), quantize them back.
  void Step8bit(const Tensor& p, const Tensor& grad, ParamState& st,
                const kernels::AdamWParams& params) {
    const int64_t n = p.numel();
    Tensor scratch[2];
    for (Tensor& s : scratch) s = Tensor::Empty({std::min(n, kChunk)}, DType::kF32, p.device());
    // Detached views: the update is not part of any autograd graph.
    const Tensor pd = p.Detach(), gd = grad.Detach();
    const auto adamw = kernels::adamw.Get(p.device());
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t len = std::min(kChunk, n - at), block = at / kBlockSize;
      for (int k = 0; k < 2; ++k) {
        const Moment& m = st.moment[k];
        Dequantize(MapOf(k), m.codes.data<uint8_t>() + at, m.absmax.data<float>() + block, len,
                   scratch[k].data<float>());
      }
      Tensor pw = pd.FlatRange(at, len), gw = gd.FlatRange(at, len);
      Tensor mw = scratch[0].FlatRange(0, len), vw = scratch[1].FlatRange(0, len);
      adamw(pw, gw, mw, vw, params);
      for (int k = 0; k < 2; ++k) {
        Moment& m = st.moment[k];
        Quantize(MapOf(k), scratch[k].data<float>(), len, m.codes.data<uint8_t>() + at,
                 m.absmax.data<float>() + block);
      }
    }
  }

  // The parameter's gradient, checked against it; undefined when it has none this step.
  static Tensor GradOf(const Tensor& p) {
    Tensor grad = p.grad();
    if (!grad.defined()) return grad;
    BRAID_CHECK(p.dtype() == DType::kF32 && grad.dtype() == DType::kF32)
        << "Adam8bit steps f32 parameters with f32 gradients; got parameter "
        << p.DescribeForError() << " with gradient " << grad.DescribeForError();
    BRAID_CHECK(grad.shape() == p.shape() && grad.device() == p.device())
        << "Adam8bit: gradient " << grad.DescribeForError() << " does not match parameter "
        << p.DescribeForError();
    return grad;
  }


  // Each moment of each parameter in one form (f32, or codes + absmax over the same blocks),
  // either both moments or neither, the maps of the codes equal to ours, nothing else; one error
  // listing everything wrong.
  absl::Status CheckStateDict(const std::map<std::string, Tensor>& state) const {
    std::vector<std::string> missing, unexpected, mismatched;
    std::map<std::string, bool> known = {{kStepKey, true}};
    auto step = state.find(kStepKey);
    if (step == state.end()) {
      missing.push_back(kStepKey);
    } else if (!step->second.defined() || step->second.numel() != 1) {
      mismatched.push_back(absl::StrCat(kStepKey, " (must hold one number)"));
    }
    auto fits = [&](const std::string& key, const Shape& shape, DType dtype) {
      const Tensor& t = state.at(key);
      if (t.defined() && t.shape() == shape && t.dtype() == dtype) return;
      mismatched.push_back(absl::StrCat(key, " (want ", DTypeName(dtype), ShapeToString(shape),
                                        ", given ",
                                        t.defined() ? t.DescribeForError() : "undefined", ")"));
    };
    bool any_codes = false;
    const auto keys = Keys();
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        const Tensor& p = groups_[g].params[i];
        std::vector<std::string> absent;
        for (const char* slot : kSlots) {
          const std::string key = absl::StrCat(keys[g][i], ".", slot);
          const std::string codes = key + ".codes", absmax = key + ".absmax";
          known[key] = known[codes] = known[absmax] = true;
          const bool has_f32 = state.count(key), has_codes = state.count(codes),
                     has_absmax = state.count(absmax);
          if (has_f32 && (has_codes || has_absmax)) {
            mismatched.push_back(absl::StrCat(key, " (given both as f32 and as codes)"));
          } else if (has_f32) {
            fits(key, p.shape(), DType::kF32);
          } else if (has_codes != has_absmax) {
            missing.push_back(has_codes ? absmax : codes);
          } else if (has_codes) {
            any_codes = true;
            fits(codes, p.shape(), DType::kU8);
            fits(absmax, {NumBlocks(p.numel())}, DType::kF32);
          } else {
            absent.push_back(key);
          }
        }
        // A parameter never stepped has no state at all; half of it is a broken dict.
        if (absent.size() == 1) missing.push_back(absent[0]);
      }
    }
    for (int k = 0; k < 2; ++k) {
      known[kMapKeys[k]] = true;
      auto it = state.find(kMapKeys[k]);
      if (it == state.end()) {
        if (any_codes) missing.push_back(kMapKeys[k]);
      } else if (!it->second.defined() || it->second.numel() != kCodes ||
                 OnHost(it->second, DType::kF32).ToFloatVector() !=
                     std::vector<float>(MapOf(k).code.begin(), MapOf(k).code.end())) {
        mismatched.push_back(absl::StrCat(
            kMapKeys[k], " (not this Adam8bit's map: the codes were made by another version)"));
      }
    }
    for (const auto& [key, t] : state) {
      if (!known.count(key)) unexpected.push_back(key);
    }
    return StateLoadError(
        "Adam8bit", missing, unexpected, mismatched,
        " keys are '<parameter name or group.index>.<exp_avg|exp_avg_sq>' (f32) or the same "
        "with '.codes' and '.absmax', 'quant_map.signed|unsigned' and 'step', for the same "
        "parameters in the same groups");
  }

  Adam8bitOptions opts_;
  int64_t step_ = 0;
  bool reported_ = false;
  std::vector<Tensor> keep_32bit_;              // by identity (KeepStates32bit)
  std::vector<std::vector<ParamState>> state_;  // [group][param]
};

}  // namespace

std::unique_ptr<Optimizer> MakeAdam8bit(std::vector<ParamGroup> groups, Adam8bitOptions opts) {
  BRAID_CHECK(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1)
      << "Adam8bit betas must be in [0, 1): got " << opts.beta1 << ", " << opts.beta2;
  return std::make_unique<Adam8bit>(std::move(groups), opts);
}

}  // namespace braid::adam8bit
