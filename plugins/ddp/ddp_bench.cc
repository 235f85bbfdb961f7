// How much of a ddp step is communication the step waits for, and what gradient_as_bucket_view
// saves, on ranks that are threads of this process (in-process communicator, CPU backend).
//
//   bazel run //plugins/ddp:ddp_bench -- [ranks=2] [steps=12] [batch=4] [model=mini|tiny]
//       [any ddp option, e.g. bucket_cap_mb=4 gradient_as_bucket_view=false]
//
// Prints, per configuration, mean seconds per step (after 2 warm-up steps) of forward,
// backward, exposed communication and optimizer, the exposed share of the step, and how many
// bucket reductions were launched before the last gradient was ready (from the strategy's
// events). The in-process communicator reduces on the thread of the last rank to arrive, inside
// its backward pass, so exposed time here is mostly waiting for the slower rank.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "backends/in_process/in_process_communicator.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "models/gpt/gpt.h"
#include "plugins/ddp/ddp_trace.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

Batch Tokens(int step, int rank, int rows, int t, int vocab) {
  std::mt19937 rng(uint32_t(step * 7919 + rank));
  std::vector<int32_t> ids, targets;
  for (int i = 0; i < rows * t; ++i) ids.push_back(int32_t(rng() % uint32_t(vocab)));
  for (int i = 0; i < rows * t; ++i) targets.push_back(int32_t(rng() % uint32_t(vocab)));
  return Batch{Tensor::FromVector(ids, {rows, t}), Tensor::FromVector(targets, {rows, t})};
}

int Main(int argc, char** argv) {
  int ranks = 2, steps = 12, batch = 4;
  std::string model_name = "mini";
  std::map<std::string, std::string> options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "ddp_bench: arguments are key=value, got '%s'\n", argv[i]);
      return 2;
    }
    std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "ranks" || key == "steps" || key == "batch") {
      int v = 0;
      if (!absl::SimpleAtoi(value, &v) || v < 1) {
        std::fprintf(stderr, "ddp_bench: %s must be a positive integer\n", key.c_str());
        return 2;
      }
      (key == "ranks" ? ranks : key == "steps" ? steps : batch) = v;
    } else if (key == "model") {
      model_name = value;
    } else {
      options[key] = value;  // passed to the strategy, which validates it
    }
  }
  std::string error;
  std::unique_ptr<bazel::tools::cpp::runfiles::Runfiles> runfiles(
      bazel::tools::cpp::runfiles::Runfiles::Create(argv[0], &error));
  std::string plugin = runfiles ? runfiles->Rlocation("braid/plugins/ddp/libbraid_ddp.so") : "";
  absl::Status loaded = LoadPlugin(plugin.empty() ? "ddp" : plugin, PluginSearchPath());
  if (!loaded.ok()) {
    std::fprintf(stderr, "ddp_bench: %s\n", std::string(loaded.message()).c_str());
    return 1;
  }
  models::GptConfig cfg = models::GptConfig::Mini();
  if (model_name == "tiny") {
    cfg.n_layer = 2;
    cfg.n_embd = 64;
    cfg.n_head = 2;
    cfg.block_size = 16;
  } else if (model_name != "mini") {
    std::fprintf(stderr, "ddp_bench: model must be mini or tiny\n");
    return 2;
  }
  const int t = int(cfg.block_size);

  struct Totals {
    double fwd = 0, bwd = 0, exposed = 0, opt = 0, step = 0;
    double unpack = 0;
    int early = 0, reductions = 0;
  };
  std::vector<Totals> totals(static_cast<size_t>(ranks));
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(ranks);
  std::vector<std::thread> threads;
  int64_t params = 0;
  size_t buckets = 0;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      models::Gpt model(cfg);
      if (r == 0) params = model.NumParameters();
      auto strategy = *Registry::Get().MakeStrategy("ddp");
      StrategyContext ctx;
      ctx.comm = group[size_t(r)].get();
      ctx.options = options;
      auto adamw = [](const std::vector<std::pair<std::string, Tensor>>& named) {
        std::vector<Tensor> ps;
        for (const auto& [n, p] : named) ps.push_back(p);
        return MakeAdamW({ParamGroup{ps, 1e-3f, 0.1f}});
      };
      absl::Status s = strategy->Setup(model, adamw, ctx);
      if (!s.ok()) {
        errors[size_t(r)] = std::string(s.message());
        return;
      }
      LossFn loss = [](Module& m, const Batch& b) {
        return ops::CrossEntropy(m(b.inputs), b.targets);
      };
      auto* intro = dynamic_cast<ddp::DdpIntrospection*>(strategy.get());
      Totals& tot = totals[size_t(r)];
      for (int step = 0; step < steps; ++step) {
        Batch b = Tokens(step, r, batch, t, int(cfg.vocab_size));
        absl::Time start = absl::Now();
        absl::StatusOr<StepStats> st = strategy->TrainStep({b}, loss);
        double dt = absl::ToDoubleSeconds(absl::Now() - start);
        if (!st.ok()) {
          errors[size_t(r)] = std::string(st.status().message());
          return;
        }
        if (step < 2) continue;  // warm-up, and the pre-rebuild layout
        tot.fwd += st->forward_s;
        tot.bwd += st->backward_s;
        tot.exposed += st->comm_exposed_s;
        tot.opt += st->optimizer_s;
        tot.step += dt;
        if (intro != nullptr) {
          double last_ready = 0;
          std::vector<double> launches;
          for (const ddp::TraceEvent& e : intro->TraceEvents()) {
            if (e.step == step && e.name == "unpack_grads")
              tot.unpack += (e.end_us - e.start_us) * 1e-6;
            if (e.step != step || e.name != "allreduce") continue;
            last_ready = std::max(last_ready, e.ready_us);
            launches.push_back(e.start_us);
          }
          for (double l : launches) tot.early += l < last_ready;
          tot.reductions += int(launches.size());
        }
      }
      if (r == 0 && intro != nullptr) buckets = intro->Buckets().size();
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < ranks; ++r) {
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "ddp_bench: rank %d: %s\n", r, errors[size_t(r)].c_str());
      return 1;
    }
  }
  std::string opts;
  for (const auto& [k, v] : options) opts += " " + k + "=" + v;
  const int measured = std::max(1, steps - 2);
  std::printf("gpt-%s (%lld parameters), %d ranks, batch %d x %d tokens per rank,%s %zu buckets\n",
              model_name.c_str(), static_cast<long long>(params), ranks, batch, t,
              opts.empty() ? " default options," : (opts + ",").c_str(), buckets);
  for (int r = 0; r < ranks; ++r) {
    const Totals& x = totals[size_t(r)];
    std::printf(
        "  rank %d: step %.1f ms = forward %.1f + backward %.1f + exposed comm %.1f + optimizer "
        "%.1f (+ other %.1f), copying reduced gradients out %.2f; exposed %.1f%% of the step; "
        "%d of %d reductions launched while backward was still producing gradients\n",
        r, 1e3 * x.step / measured, 1e3 * x.fwd / measured, 1e3 * x.bwd / measured,
        1e3 * x.exposed / measured, 1e3 * x.opt / measured,
        1e3 * (x.step - x.fwd - x.bwd - x.exposed - x.opt) / measured, 1e3 * x.unpack / measured,
        x.step > 0 ? 100 * x.exposed / x.step : 0.0, x.early, x.reductions);
  }
  return 0;
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) { return braid::Main(argc, argv); }
