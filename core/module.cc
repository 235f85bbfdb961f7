#include "core/module.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/autograd.h"

namespace braid {

namespace {
std::atomic<uint64_t> g_next_hook_id{1};

// Adds `h` to one of a module's hook lists under a new id (what RemoveHook takes).
template <typename HookEntries>
uint64_t AppendHook(HookEntries& hooks, Module::Hook h) {
  const uint64_t id = g_next_hook_id++;
  hooks.push_back({id, std::move(h)});
  return id;
}

std::string Join(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  if (name.empty()) return prefix;  // a child itself, in NamedModules: "block", not "block."
  return absl::StrCat(prefix, ".", name);
}
}  // namespace

Module::~Module() {
  for (auto& [p, id] : tracked_params_) p.RemoveHook(id);
}

Tensor Module::RegisterParameter(const std::string& name, Tensor t) {
  BRAID_CHECK(t.defined()) << type_name_ << ": parameter '" << name << "' is undefined";
  if (t.name().empty()) t.set_name(name);
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::RegisterBuffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return t;
}

void Module::AddChild(const std::string& name, std::unique_ptr<Module> m) {
  for (auto& c : children_) BRAID_CHECK(c.first != name) << "two children named " << name;
  children_.emplace_back(name, m.get());
  owned_children_.push_back(std::move(m));
}

void Module::BorrowModule(const std::string& name, Module* m) {
  for (auto& c : children_) BRAID_CHECK(c.first != name) << "two children named " << name;
  children_.emplace_back(name, m);
}

void Module::ShareParameter(const std::string& name, Tensor t) { params_.emplace_back(name, t); }

Tensor Module::param(const std::string& name) const {
  for (auto& [n, t] : params_) {
    if (n == name) return t;
  }
  BRAID_CHECK(false) << type_name_ << " has no parameter '" << name << "'";
  return Tensor();
}

void Module::CollectParams(const std::string& prefix, NamedTensors* out, bool buffers) const {
  for (auto& [n, t] : buffers ? buffers_ : params_) out->emplace_back(Join(prefix, n), t);
  for (auto& [n, c] : children_) c->CollectParams(Join(prefix, n), out, buffers);
}

Module::NamedTensors Module::NamedParameters() const {
  NamedTensors out;
  CollectParams("", &out, false);
  // A tensor shared by two modules (tied weights) is listed once, under its first name.
  std::set<TensorImpl*> seen;
  NamedTensors unique;
  for (auto& [n, t] : out) {
    if (seen.insert(t.impl()).second) unique.emplace_back(n, t);
  }
  return unique;
}

std::vector<Tensor> Module::Parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : NamedParameters()) out.push_back(t);
  return out;
}

Module::NamedTensors Module::NamedBuffers() const {
  NamedTensors out;
  CollectParams("", &out, true);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::NamedChildren() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [n, c] : children_) out.emplace_back(n, c);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::NamedModules() {
  std::vector<std::pair<std::string, Module*>> out = {{"", this}};
  for (auto& [n, c] : children_) {
    for (auto& [sub, m] : c->NamedModules()) out.emplace_back(Join(n, sub), m);
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::NamedBlocks() {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [n, m] : NamedModules()) {
    if (m->is_block()) out.emplace_back(n, m);
  }
  return out;
}

int64_t Module::NumParameters() const {
  int64_t n = 0;
  for (auto& [name, t] : NamedParameters()) n += t.numel();
  return n;
}

std::map<std::string, Tensor> Module::StateDict() const {
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : NamedParameters()) out[n] = t.Detach();
  for (auto& [n, t] : NamedBuffers()) out[n] = t.Detach();
  return out;
}

absl::Status Module::LoadStateDict(const std::map<std::string, Tensor>& state, bool strict) {
  std::map<std::string, Tensor> mine;
  for (auto& [n, t] : NamedParameters()) mine[n] = t;
  for (auto& [n, t] : NamedBuffers()) mine[n] = t;
  std::vector<std::string> missing, unexpected, mismatched;
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it == state.end()) {
      missing.push_back(n);
    } else if (it->second.shape() != t.shape()) {
      mismatched.push_back(absl::StrCat(n, " (model ", ShapeToString(t.shape()), ", given ",
                                        ShapeToString(it->second.shape()), ")"));
    }
  }
  for (auto& [n, t] : state) {
    if (!mine.count(n)) unexpected.push_back(n);
  }
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string msg = absl::StrCat("cannot load state dict into ", type_name_, ":");
    if (!missing.empty()) absl::StrAppend(&msg, " missing keys: ", absl::StrJoin(missing, ", "), ";");
    if (!unexpected.empty()) {
      absl::StrAppend(&msg, " unexpected keys: ", absl::StrJoin(unexpected, ", "), ";");
    }
    if (!mismatched.empty()) {
      absl::StrAppend(&msg, " shape mismatches: ", absl::StrJoin(mismatched, ", "), ";");
    }
    return absl::InvalidArgumentError(msg);
  }
  autograd::NoGradGuard ng;
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it != state.end()) t.Detach().CopyFrom(it->second);
  }
  return absl::OkStatus();
}

void Module::Train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->Train(on);
}

void Module::ZeroGrad() {
  for (Tensor& t : Parameters()) t.ZeroGrad();
}

uint64_t Module::AddForwardPreHook(Hook h) { return AppendHook(fwd_pre_, std::move(h)); }
uint64_t Module::AddForwardHook(Hook h) { return AppendHook(fwd_post_, std::move(h)); }
uint64_t Module::AddBackwardPreHook(Hook h) { return AppendHook(bwd_pre_, std::move(h)); }
uint64_t Module::AddBackwardHook(Hook h) {
  const uint64_t id = AppendHook(bwd_post_, std::move(h));
  InstallBackwardTracking();
  return id;
}

void Module::RemoveHook(uint64_t id) {
  for (auto* v : {&fwd_pre_, &fwd_post_, &bwd_pre_, &bwd_post_}) {
    v->erase(std::remove_if(v->begin(), v->end(), [id](const HookEntry& e) { return e.id == id; }),
             v->end());
  }
}

void Module::InstallBackwardTracking() {
  if (tracking_installed_) return;
  tracking_installed_ = true;
  for (Tensor& p : Parameters()) {
    uint64_t id = p.RegisterPostAccumulateGradHook([this](Tensor&) {
      if (post_fired_) return;
      if (--pending_params_ == 0) FirePostBackward();
    });
    tracked_params_.emplace_back(p, id);
  }
}

void Module::FirePostBackward() {
  if (post_fired_) return;
  post_fired_ = true;
  auto hooks = bwd_post_;
  for (auto& h : hooks) h.fn(*this);
}

Tensor Module::operator()(const Tensor& x) {
  for (auto& h : std::vector<HookEntry>(fwd_pre_)) h.fn(*this);
  Tensor out = replaced_forward_ ? replaced_forward_(x) : Forward(x);
  for (auto& h : std::vector<HookEntry>(fwd_post_)) h.fn(*this);
  bool want_bwd = !bwd_pre_.empty() || !bwd_post_.empty();
  if (want_bwd && autograd::GradEnabled() && out.defined() && out.requires_grad()) {
    // An identity node on the output: its backward is the moment the output's gradient arrives.
    Tensor wrapped = out.Detach();
    autograd::RecordFunction(
        absl::StrCat(type_name_, ".BackwardHook"), {out}, {&wrapped},
        [this](const std::vector<Tensor>& g) {
          pending_params_ = int(tracked_params_.size());
          post_fired_ = tracked_params_.empty() && bwd_post_.empty();
          for (auto& h : std::vector<HookEntry>(bwd_pre_)) h.fn(*this);
          if (!bwd_post_.empty()) {
            if (pending_params_ == 0) {
              FirePostBackward();
            } else {
              // Parameters that get no gradient this pass must not keep post-backward waiting;
              // it still fires before the end-of-backward callbacks, which wait on its work.
              autograd::QueuePostBackwardCallback([this] { FirePostBackward(); });
            }
          }
          return std::vector<Tensor>{g[0]};
        });
    return wrapped;
  }
  return out;
}

}  // namespace braid
