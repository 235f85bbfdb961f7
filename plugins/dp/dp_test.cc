// Loads libbraid_dp.so the way the trainer does and checks the single-process data-parallel
// strategy against training on one device: both loss modes, 2 and 3 devices (cpu:N devices,
// each with its own allocator), gradient accumulation, clipping, uneven and idle shards, replica
// consistency, the first device's peak memory in each mode, and the errors a user can meet.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/in_process_communicator.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"
#include "models/mlp/mlp.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::HasSubstr;

// ---- Models and data ------------------------------------------------------------------------

enum class Kind { kMlp, kGpt };

models::MlpConfig SmallMlp(uint64_t seed) {
  models::MlpConfig c;
  c.in = 12;
  c.hidden = 16;
  c.out = 5;
  c.seed = seed;
  return c;
}

models::GptConfig TinyGpt(uint64_t seed) {
  models::GptConfig c;
  c.vocab_size = 256;
  c.padded_vocab_size = 256;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.seed = seed;
  return c;
}

// The seed differs per call so that replicas start unlike the master: Setup must overwrite them.
std::unique_ptr<Module> MakeModel(Kind kind, Device device, uint64_t seed) {
  if (kind == Kind::kMlp) return std::make_unique<models::Mlp>(SmallMlp(seed), device);
  return std::make_unique<models::Gpt>(TinyGpt(seed), device);
}

// `rows` rows of step `step`'s data, deterministic.
Batch MakeBatch(Kind kind, int step, int64_t rows) {
  std::mt19937 rng(uint32_t(1000 + step));
  if (kind == Kind::kMlp) {
    models::MlpConfig c = SmallMlp(0);
    std::normal_distribution<float> x(0.0f, 1.0f);
    std::uniform_int_distribution<int32_t> y(0, int32_t(c.out - 1));
    std::vector<float> in(static_cast<size_t>(rows * c.in));
    std::vector<int32_t> target(static_cast<size_t>(rows));
    for (float& v : in) v = x(rng);
    for (int32_t& v : target) v = y(rng);
    return Batch{Tensor::FromVector(in, {rows, c.in}), Tensor::FromVector(target, {rows})};
  }
  models::GptConfig c = TinyGpt(0);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab_size - 1));
  std::vector<int32_t> ids(size_t(rows * c.block_size)), next(ids.size());
  for (int32_t& v : ids) v = tok(rng);
  for (int32_t& v : next) v = tok(rng);
  return Batch{Tensor::FromVector(ids, {rows, c.block_size}),
               Tensor::FromVector(next, {rows, c.block_size})};
}

// Micro-batch m of k equal parts of `full` (views of its rows).
std::vector<Batch> Split(const Batch& full, int k) {
  const int64_t rows = full.inputs.size(0) / k;
  std::vector<Batch> parts;
  for (int m = 0; m < k; ++m) {
    parts.push_back(Batch{full.inputs.Slice(m * rows, (m + 1) * rows),
                          full.targets.Slice(m * rows, (m + 1) * rows)});
  }
  return parts;
}

Tensor CrossEntropyLoss(Module& model, const Batch& batch) {
  return ops::CrossEntropy(model(batch.inputs), batch.targets);
}

// eps 1e-6 rather than 1e-8: AdamW's first steps move each parameter by about lr * g / (|g| +
// eps), so a gradient near eps whose last bits differ between two f32 summation orders moves its
// parameter measurably differently (by up to lr * noise / (4 eps)). Some GPT gradients are pure
// rounding noise (the attention key bias's is exactly zero in exact arithmetic), and with the
// default eps two correct implementations then disagree by a good fraction of lr.
std::unique_ptr<Optimizer> AdamW(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  AdamWOptions options;
  options.eps = 1e-6f;
  return MakeAdamW({ParamGroup{params, 3e-3f, 0.01f}}, options);
}

// ---- Comparisons ----------------------------------------------------------------------------

// The worst deviation seen over several comparisons, and where.
struct Deviation {
  double worst = 0;
  std::string where;
  void Add(const std::pair<double, std::string>& d, const std::string& when) {
    if (d.first >= worst) {
      worst = d.first;
      where = d.second + " at " + when;
    }
  }
};

// max |got - want| / max |want| over each parameter's gradient (a scale-free rounding measure).
std::pair<double, std::string> CompareGrads(const Module& got, const Module& want) {
  Module::NamedTensors g = got.NamedParameters(), w = want.NamedParameters();
  BRAID_CHECK(g.size() == w.size());
  std::pair<double, std::string> worst{0, ""};
  for (size_t j = 0; j < g.size(); ++j) {
    BRAID_CHECK(g[j].first == w[j].first);
    BRAID_CHECK(g[j].second.grad().defined() && w[j].second.grad().defined()) << g[j].first;
    std::vector<float> a = g[j].second.grad().ToFloatVector();
    std::vector<float> b = w[j].second.grad().ToFloatVector();
    double scale = 0, diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      scale = std::max(scale, double(std::fabs(b[i])));
      diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    }
    double d = scale > 0 ? diff / scale : diff;
    if (d >= worst.first) worst = {d, "grad of " + g[j].first};
  }
  return worst;
}

// max over elements of |got - want| beyond rtol * |want|, over every tensor of the state.
std::pair<double, std::string> CompareValues(const Module& got, const Module& want, float rtol) {
  std::map<std::string, Tensor> g = got.StateDict();
  std::pair<double, std::string> worst{0, ""};
  for (const auto& [name, w] : want.StateDict()) {
    BRAID_CHECK(g.count(name)) << name;
    std::vector<float> a = g.at(name).ToFloatVector(), b = w.ToFloatVector();
    BRAID_CHECK(a.size() == b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      double d = std::fabs(a[i] - b[i]) - rtol * std::fabs(b[i]);
      if (d > worst.first) {
        worst = {d, name + "[" + std::to_string(i) + "] " + std::to_string(a[i]) + " vs " +
                        std::to_string(b[i])};
      }
    }
  }
  return worst;
}

void ExpectClose(const Module& got, const Module& want, double atol, float rtol,
                 const std::string& where) {
  std::pair<double, std::string> d = CompareValues(got, want, rtol);
  EXPECT_LE(d.first, atol) << where << ": " << d.second;
}

void CopyValues(const Module& from, Module* to) {
  absl::Status s = to->LoadStateDict(from.StateDict());
  BRAID_CHECK(s.ok()) << s;
}

// Bit-for-bit equal values (replicas are copies, not recomputations).
void ExpectIdentical(const Module& got, const Module& want, const std::string& where) {
  std::map<std::string, Tensor> g = got.StateDict();
  std::map<std::string, Tensor> w = want.StateDict();
  ASSERT_EQ(g.size(), w.size()) << where;
  for (const auto& [name, t] : w) {
    ASSERT_TRUE(g.count(name)) << where << ": " << name;
    EXPECT_EQ(g.at(name).ToFloatVector(), t.ToFloatVector()) << where << ": " << name;
  }
}

// ---- Fixture --------------------------------------------------------------------------------

class DpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles, nullptr) << error;
    plugin_ = runfiles->Rlocation("braid/plugins/dp/libbraid_dp.so");
    absl::Status s = LoadPlugin(plugin_, {});
    ASSERT_TRUE(s.ok()) << s;
  }

  static std::unique_ptr<Strategy> MakeDp() {
    absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy("dp");
    BRAID_CHECK(made.ok()) << made.status();
    return std::move(*made);
  }

  static std::string Devices(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? ",cpu:" : "cpu:") + std::to_string(i);
    return s;
  }

  // Replicas built for the strategy, remembered so the test can look at them.
  struct Made {
    std::vector<Module*> modules;
    std::vector<Device> devices;
  };
  static ModuleFactory Factory(Kind kind, Made* made) {
    return [kind, made](Device d) {
      std::unique_ptr<Module> m = MakeModel(kind, d, 77 + made->modules.size());
      made->modules.push_back(m.get());
      made->devices.push_back(d);
      return m;
    };
  }

  static StrategyContext Context(int devices, const std::string& mode, ModuleFactory factory) {
    StrategyContext ctx;
    ctx.options["devices"] = Devices(devices);
    ctx.options["loss_mode"] = mode;
    ctx.make_replica = std::move(factory);
    return ctx;
  }

  std::string plugin_;
};

// ---- Equivalence with single-device training ------------------------------------------------

struct Case {
  Kind kind;
  const char* mode;
  int devices;
  int accumulation;
  int64_t rows;  // per micro-batch: uneven shards on purpose
};

class DpEquivalenceTest : public DpTest, public ::testing::WithParamInterface<Case> {};

TEST_P(DpEquivalenceTest, FiveAdamWStepsEqualSingleDeviceTraining) {
  const Case c = GetParam();
  std::unique_ptr<Strategy> dp = MakeDp();
  EXPECT_EQ(dp->name(), "dp");
  std::unique_ptr<Module> model = MakeModel(c.kind, Device::CPU(0), 1);
  Made made;
  ASSERT_TRUE(dp->Setup(*model, AdamW, Context(c.devices, c.mode, Factory(c.kind, &made))).ok());
  ASSERT_EQ(made.modules.size(), size_t(c.devices - 1));
  for (int i = 1; i < c.devices; ++i) EXPECT_EQ(made.devices[size_t(i - 1)], Device::CPU(i));
  for (int i = 1; i < c.devices; ++i) {
    // Built from another seed, so equal only because Setup copied the master in.
    ExpectIdentical(*made.modules[size_t(i - 1)], *model, "replica " + std::to_string(i));
    for (const Tensor& p : made.modules[size_t(i - 1)]->Parameters()) {
      EXPECT_EQ(p.device(), Device::CPU(i));
    }
  }

  // The reference trajectory: the same initial values and optimizer, each step's whole batch on
  // one device. The probe checks each step's gradient on its own: it takes the strategy's
  // parameters before the step and computes the whole batch's gradient, which the gradient the
  // strategy reduced onto the master must equal.
  std::unique_ptr<Module> reference = MakeModel(c.kind, Device::CPU(0), 1);
  std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
  std::unique_ptr<Module> probe = MakeModel(c.kind, Device::CPU(0), 1);
  std::map<std::string, std::vector<float>> initial;  // copies: StateDict hands out the tensors
  for (const auto& [name, t] : model->StateDict()) {
    if (t.dtype() == DType::kF32 && name.find("weight") != std::string::npos) {
      initial[name] = t.ToFloatVector();
    }
  }

  Deviation grads, params, norm;
  for (int step = 0; step < 5; ++step) {
    Batch full = MakeBatch(c.kind, step, c.rows * c.accumulation);
    CopyValues(*model, probe.get());
    probe->ZeroGrad();
    Tensor probe_loss = CrossEntropyLoss(*probe, full);
    probe_loss.Backward();
    const float probe_norm = ClipGradNorm(probe->Parameters(), 0.0f);  // measures only

    absl::StatusOr<StepStats> stats = dp->TrainStep(Split(full, c.accumulation), CrossEntropyLoss);
    ASSERT_TRUE(stats.ok()) << stats.status();

    reference_opt->ZeroGrad();
    CrossEntropyLoss(*reference, full).Backward();
    reference_opt->Step();

    const std::string where = "step " + std::to_string(step);
    EXPECT_NEAR(stats->loss, probe_loss.item(), 1e-5 * std::fabs(probe_loss.item())) << where;
    // Clipping is off, yet the reduced gradient's norm is reported.
    ASSERT_GT(probe_norm, 0.0f);
    norm.Add({std::fabs(stats->grad_norm - probe_norm) / probe_norm, "grad_norm"}, where);
    EXPECT_GE(stats->forward_s, 0.0);
    EXPECT_GE(stats->backward_s, 0.0);
    // f32 rounding of sums taken in another order: ~1e-7 of a tensor's largest gradient.
    grads.Add(CompareGrads(*model, *probe), where);
    // AdamW divides each gradient by its own running magnitude, which turns the rounding of the
    // smallest gradients into visible parameter differences (see AdamW above): looser.
    params.Add(CompareValues(*model, *reference, 2e-4f), where);
    for (int i = 1; i < c.devices; ++i) {
      ExpectIdentical(*made.modules[size_t(i - 1)], *model,
                      "replica " + std::to_string(i) + " after " + where);
    }
  }
  std::printf("[dp vs one device] %s: worst gradient deviation %.3g of the tensor's largest "
              "(%s), worst parameter deviation %.3g (%s)\n",
              ::testing::UnitTest::GetInstance()->current_test_info()->name(), grads.worst,
              grads.where.c_str(), params.worst, params.where.c_str());
  std::printf("[dp vs one device] worst relative grad_norm deviation %.3g (%s)\n", norm.worst,
              norm.where.c_str());
  EXPECT_LE(grads.worst, 5e-6) << grads.where;
  EXPECT_LE(params.worst, 3e-5) << params.where;
  // The probe's norm is of the same gradient summed in one pass: measured up to 1.03e-7.
  EXPECT_LE(norm.worst, 5e-7) << norm.where;

  // Training moved the parameters, so the comparisons above were not between untouched models.
  std::map<std::string, Tensor> now = model->StateDict();
  for (const auto& [name, values] : initial) {
    EXPECT_NE(now.at(name).ToFloatVector(), values) << name;
  }
  absl::StatusOr<std::map<std::string, Tensor>> full = dp->FullStateDict();
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->size(), now.size());
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.kind == Kind::kMlp ? "Mlp" : "Gpt") + "_" + c.mode + "_" +
         std::to_string(c.devices) + "dev_accum" + std::to_string(c.accumulation);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DpEquivalenceTest,
    ::testing::Values(Case{Kind::kMlp, "balanced", 2, 1, 7}, Case{Kind::kMlp, "gather", 2, 1, 7},
                      Case{Kind::kMlp, "balanced", 3, 1, 8}, Case{Kind::kMlp, "gather", 3, 1, 8},
                      Case{Kind::kMlp, "balanced", 2, 3, 5}, Case{Kind::kMlp, "gather", 2, 3, 5},
                      Case{Kind::kMlp, "balanced", 3, 2, 7}, Case{Kind::kMlp, "gather", 3, 2, 7},
                      Case{Kind::kGpt, "balanced", 2, 1, 5}, Case{Kind::kGpt, "gather", 2, 1, 5},
                      Case{Kind::kGpt, "balanced", 3, 1, 4}, Case{Kind::kGpt, "gather", 3, 1, 4},
                      Case{Kind::kGpt, "balanced", 2, 2, 3}, Case{Kind::kGpt, "gather", 2, 2, 3},
                      Case{Kind::kGpt, "balanced", 3, 2, 4}, Case{Kind::kGpt, "gather", 3, 2, 4}),
    CaseName);

TEST_F(DpTest, MicroBatchSmallerThanTheDeviceCountLeavesDevicesIdle) {
  for (const char* mode : {"balanced", "gather"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    Made made;
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(3, mode, Factory(Kind::kMlp, &made))).ok());
    std::unique_ptr<Module> reference = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
    for (int step = 0; step < 3; ++step) {
      Batch batch = MakeBatch(Kind::kMlp, step, 2);  // cpu:2 gets no rows
      ASSERT_TRUE(dp->TrainStep({batch}, CrossEntropyLoss).ok());
      reference_opt->ZeroGrad();
      CrossEntropyLoss(*reference, batch).Backward();
      reference_opt->Step();
      ExpectClose(*model, *reference, 2e-6f, 2e-4f, std::string(mode) + " step " +
                                                        std::to_string(step));
      ExpectIdentical(*made.modules[1], *model, std::string(mode) + " idle replica");
    }
  }
}

TEST_F(DpTest, EachDeviceRunsForwardAndBackwardOnItsOwnThread) {
  for (const char* mode : {"balanced", "gather"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    Made made;
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(3, mode, Factory(Kind::kMlp, &made))).ok());
    std::vector<Module*> replicas = {model.get(), made.modules[0], made.modules[1]};
    std::mutex mu;
    std::vector<std::thread::id> forward(3), backward(3);
    for (size_t i = 0; i < 3; ++i) {
      replicas[i]->AddForwardPreHook([&, i](Module&) {
        std::lock_guard<std::mutex> lock(mu);
        forward[i] = std::this_thread::get_id();
      });
      replicas[i]->AddBackwardHook([&, i](Module&) {
        std::lock_guard<std::mutex> lock(mu);
        backward[i] = std::this_thread::get_id();
      });
    }
    ASSERT_TRUE(dp->TrainStep({MakeBatch(Kind::kMlp, 0, 6)}, CrossEntropyLoss).ok());
    EXPECT_EQ(forward[0], std::this_thread::get_id()) << mode;
    EXPECT_EQ(backward[0], std::this_thread::get_id()) << mode;
    for (size_t i = 1; i < 3; ++i) {
      EXPECT_NE(forward[i], std::thread::id()) << mode << " replica " << i << " never ran";
      EXPECT_NE(backward[i], std::thread::id()) << mode << " replica " << i;
      for (size_t k = 0; k < i; ++k) {
        EXPECT_NE(forward[i], forward[k]) << mode << ": replicas " << k << " and " << i;
        EXPECT_NE(backward[i], backward[k]) << mode << ": replicas " << k << " and " << i;
      }
    }
  }
}

TEST_F(DpTest, ClipsTheReducedGradient) {
  std::unique_ptr<Strategy> dp = MakeDp();
  std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  Made made;
  StrategyContext ctx = Context(3, "balanced", Factory(Kind::kMlp, &made));
  ctx.max_grad_norm = 0.05f;
  ASSERT_TRUE(dp->Setup(*model, AdamW, ctx).ok());
  std::unique_ptr<Module> reference = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
  for (int step = 0; step < 3; ++step) {
    Batch batch = MakeBatch(Kind::kMlp, step, 9);
    absl::StatusOr<StepStats> stats = dp->TrainStep({batch}, CrossEntropyLoss);
    ASSERT_TRUE(stats.ok()) << stats.status();
    reference_opt->ZeroGrad();
    CrossEntropyLoss(*reference, batch).Backward();
    float norm = ClipGradNorm(reference->Parameters(), 0.05f);
    reference_opt->Step();
    EXPECT_GT(norm, 0.05f);  // clipping took effect
    EXPECT_NEAR(stats->grad_norm, norm, 1e-4f * norm);
    ExpectClose(*model, *reference, 2e-6f, 2e-4f, "step " + std::to_string(step));
  }
}

TEST_F(DpTest, OneDeviceNeedsNoReplicaFactory) {
  std::unique_ptr<Strategy> dp = MakeDp();
  std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  StrategyContext ctx;
  ctx.options["devices"] = "cpu:0";
  ASSERT_TRUE(dp->Setup(*model, AdamW, ctx).ok());
  std::unique_ptr<Module> reference = MakeModel(Kind::kMlp, Device::CPU(0), 1);
  std::unique_ptr<Optimizer> reference_opt = AdamW(reference->NamedParameters());
  Batch batch = MakeBatch(Kind::kMlp, 0, 6);
  ASSERT_TRUE(dp->TrainStep({batch}, CrossEntropyLoss).ok());
  CrossEntropyLoss(*reference, batch).Backward();
  reference_opt->Step();
  ExpectClose(*model, *reference, 0.0f, 0.0f, "one device");
}

// ---- First-device memory --------------------------------------------------------------------

struct Peak {
  int64_t base = 0;  // held on cpu:0 when the measured step starts
  int64_t peak = 0;  // cpu:0's peak during the step
};

// Trains a model with large outputs one warm-up step (AdamW allocates its state there), then
// measures cpu:0 over one more step. Everything is freed before returning, so the calls do not
// see each other's tensors.
Peak MeasureFirstDevice(Kind kind, const std::string& mode, int devices, int64_t rows,
                        const ModuleFactory& make) {
  std::unique_ptr<Strategy> dp = *Registry::Get().MakeStrategy("dp");
  std::unique_ptr<Module> model = make(Device::CPU(0));
  StrategyContext ctx;
  ctx.options["devices"] = "cpu:0,cpu:1" + std::string(devices == 3 ? ",cpu:2" : "");
  ctx.options["loss_mode"] = mode;
  ctx.make_replica = make;
  BRAID_CHECK(dp->Setup(*model, AdamW, ctx).ok());
  Batch batch;
  if (kind == Kind::kGpt) {
    batch = MakeBatch(Kind::kGpt, 0, rows);
  } else {
    std::vector<float> x(static_cast<size_t>(rows * 64));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
    std::vector<int32_t> y(static_cast<size_t>(rows));
    for (size_t i = 0; i < y.size(); ++i) y[i] = int32_t(i * 131 % 8192);
    batch = Batch{Tensor::FromVector(x, {rows, 64}), Tensor::FromVector(y, {rows})};
  }
  BRAID_CHECK(dp->TrainStep({batch}, CrossEntropyLoss).ok());
  GetAllocator(Device::CPU(0))->ResetPeak();
  Peak p;
  p.base = GetMemoryStats(Device::CPU(0)).current_bytes;
  BRAID_CHECK(dp->TrainStep({batch}, CrossEntropyLoss).ok());
  p.peak = GetMemoryStats(Device::CPU(0)).peak_bytes;
  return p;
}

TEST_F(DpTest, BalancedModeKeepsTheFirstDevicePeakBelowGatherMode) {
  // An MLP with a wide output layer (64 -> 64 -> 8192 logits) and a tiny GPT: their outputs
  // (logits) dominate the activations.
  ModuleFactory wide = [](Device d) {
    models::MlpConfig c;
    c.in = 64;
    c.hidden = 64;
    c.out = 8192;
    return std::unique_ptr<Module>(std::make_unique<models::Mlp>(c, d));
  };
  ModuleFactory gpt = [](Device d) {
    return std::unique_ptr<Module>(std::make_unique<models::Gpt>(TinyGpt(1), d));
  };
  struct Setting {
    const char* model;
    Kind kind;
    ModuleFactory* make;
    int64_t rows;
    int64_t output_bytes;  // of the whole micro-batch's logits
  };
  const Setting settings[] = {
      Setting{"mlp 64-64-8192", Kind::kMlp, &wide, 96, 96 * 8192 * 4},
      Setting{"gpt 2x64, vocab 256", Kind::kGpt, &gpt, 12, 12 * 16 * 256 * 4}};
  for (const Setting& s : settings) {
    for (int devices : {2, 3}) {
      Peak gather = MeasureFirstDevice(s.kind, "gather", devices, s.rows, *s.make);
      Peak balanced = MeasureFirstDevice(s.kind, "balanced", devices, s.rows, *s.make);
      std::printf(
          "[dp peak cpu:0] %s, batch %lld, %d devices: gather %lld bytes (%lld held before the "
          "step), balanced %lld bytes (%lld held before), ratio %.2f\n",
          s.model, static_cast<long long>(s.rows), devices, static_cast<long long>(gather.peak),
          static_cast<long long>(gather.base), static_cast<long long>(balanced.peak),
          static_cast<long long>(balanced.base), double(gather.peak) / double(balanced.peak));
      EXPECT_EQ(gather.base, balanced.base) << s.model;
      EXPECT_LT(balanced.peak, gather.peak) << s.model << ", " << devices << " devices";
      // Gather mode holds, beyond balanced mode, at least the other devices' outputs.
      EXPECT_GE(gather.peak - balanced.peak, s.output_bytes * (devices - 1) / devices)
          << s.model << ", " << devices << " devices";
    }
  }
}

// ---- Errors ---------------------------------------------------------------------------------

TEST_F(DpTest, ReportsMisuse) {
  EXPECT_TRUE(LoadPlugin(plugin_, {}).ok());  // loading again is a no-op
  EXPECT_TRUE(EnsureStrategy("dp", {}).ok());
  Made made;
  auto setup_error = [&](StrategyContext ctx) {
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    return std::string(MakeDp()->Setup(*model, AdamW, ctx).message());
  };

  EXPECT_EQ(MakeDp()->TrainStep({MakeBatch(Kind::kMlp, 0, 2)}, CrossEntropyLoss).status().code(),
            absl::StatusCode::kFailedPrecondition);

  StrategyContext ctx = Context(2, "balanced", Factory(Kind::kMlp, &made));
  ctx.options["bucket_cap_mb"] = "25";
  EXPECT_THAT(setup_error(ctx), HasSubstr("bucket_cap_mb"));

  ctx = Context(2, "balanced", Factory(Kind::kMlp, &made));
  ctx.options["devices"] = "cpu:0,gpu:1";
  EXPECT_THAT(setup_error(ctx), HasSubstr("'gpu:1'"));
  ctx.options["devices"] = "cpu:0, cpu:1,cpu:0";
  EXPECT_THAT(setup_error(ctx), HasSubstr("cpu:0 twice"));

  EXPECT_THAT(setup_error(Context(2, "scatter", Factory(Kind::kMlp, &made))),
              HasSubstr("loss_mode 'scatter'"));
  EXPECT_THAT(setup_error(Context(2, "gather", nullptr)), HasSubstr("make_replica"));
  StrategyContext defaults;  // two devices by default, so a factory is needed
  EXPECT_THAT(setup_error(defaults), HasSubstr("cpu:0,cpu:1"));

  // A factory that builds another architecture.
  ModuleFactory wider = [](Device d) {
    models::MlpConfig c = SmallMlp(1);
    c.hidden = 17;
    return std::unique_ptr<Module>(std::make_unique<models::Mlp>(c, d));
  };
  std::string mismatch = setup_error(Context(2, "balanced", wider));
  EXPECT_THAT(mismatch, HasSubstr("fc1.weight"));
  EXPECT_THAT(mismatch, HasSubstr("cpu:1"));
  ModuleFactory null_factory = [](Device) { return std::unique_ptr<Module>(); };
  EXPECT_THAT(setup_error(Context(2, "balanced", null_factory)), HasSubstr("null"));

  std::vector<std::unique_ptr<Communicator>> two = MakeInProcessGroup(2);
  ctx = Context(2, "balanced", Factory(Kind::kMlp, &made));
  ctx.comm = two[0].get();
  EXPECT_THAT(setup_error(ctx), HasSubstr("2 ranks"));

  // Step-time errors, in both modes.
  for (const char* mode : {"balanced", "gather"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(2, mode, Factory(Kind::kMlp, &made))).ok());
    EXPECT_EQ(dp->TrainStep({}, CrossEntropyLoss).status().code(),
              absl::StatusCode::kInvalidArgument);
    Batch uneven = MakeBatch(Kind::kMlp, 0, 4);
    uneven.targets = uneven.targets.Slice(0, 3);
    EXPECT_THAT(std::string(dp->TrainStep({uneven}, CrossEntropyLoss).status().message()),
                HasSubstr("same number of rows"));
    auto constant = [](Module& m, const Batch& b) {
      m(b.inputs);
      return Tensor::Scalar(1.0f);
    };
    EXPECT_THAT(
        std::string(dp->TrainStep({MakeBatch(Kind::kMlp, 0, 4)}, constant).status().message()),
        HasSubstr("depends on no trainable parameter"));
    // Failed steps leave the model as it was.
    ExpectIdentical(*model, *MakeModel(Kind::kMlp, Device::CPU(0), 1), mode);
  }

  // A loss that is not criterion(model(inputs), targets) cannot run in gather mode, but can in
  // balanced mode.
  auto twice = [](Module& m, const Batch& b) {
    return ops::Add(CrossEntropyLoss(m, b), ops::Scale(CrossEntropyLoss(m, b), 0.5f));
  };
  for (const char* mode : {"gather", "balanced"}) {
    std::unique_ptr<Strategy> dp = MakeDp();
    std::unique_ptr<Module> model = MakeModel(Kind::kMlp, Device::CPU(0), 1);
    ASSERT_TRUE(dp->Setup(*model, AdamW, Context(2, mode, Factory(Kind::kMlp, &made))).ok());
    absl::StatusOr<StepStats> st = dp->TrainStep({MakeBatch(Kind::kMlp, 0, 4)}, twice);
    if (std::string(mode) == "gather") {
      EXPECT_THAT(std::string(st.status().message()), HasSubstr("called the model 2 time(s)"));
      EXPECT_THAT(std::string(st.status().message()), HasSubstr("loss_mode=balanced"));
    } else {
      EXPECT_TRUE(st.ok()) << st.status();
    }
  }
}

}  // namespace
}  // namespace braid
