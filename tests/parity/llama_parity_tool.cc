// Braid's side of the Llama parity test (llama_parity_test.sh): builds models/llama from a Hugging
// Face checkpoint folder (config.json for the shape; model.safetensors, or the shards of
// model.safetensors.index.json, for the weights), then writes to OUT (safetensors):
//   logits      the logits of the first batch, before any step  [B, T, V]
//   losses      the loss of each step                           [S]
//   final.NAME  every parameter after the S AdamW steps
// BATCHES (safetensors) holds "ids" and "targets", i32 [S, B, T]: step s trains on row s.
// AdamW: lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices, none on norms.
//
// Usage: llama_parity_tool CHECKPOINT_FOLDER BATCHES OUT
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/weights_match.h"
#include "models/llama/hf_checkpoint.h"
#include "models/llama/hf_config.h"
#include "models/llama/llama.h"
#include "plugins/checkpoint/safetensors.h"
#include "plugins/checkpoint/sharded_safetensors.h"

namespace braid {
namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "llama_parity_tool: %s\n", std::string(st.message()).c_str());
  return 1;
}

// The checkpoint's weights under the model's names (a tied head's copy dropped), every name and
// shape checked against `model`, as the training program's init_from does.
absl::StatusOr<std::map<std::string, Tensor>> LoadHfWeights(const std::string& path,
                                                            const models::Llama& model) {
  BRAID_ASSIGN_OR_RETURN(auto weights, LoadSafetensorsWeights(path));
  models::DropTiedCopies(model.config(), &weights);
  std::map<std::string, Shape> shapes;
  for (auto& [name, t] : model.NamedParameters()) shapes[name] = t.shape();
  BRAID_RETURN_IF_ERROR(CheckWeightsMatch(shapes, weights, path));
  return weights;
}

int Main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: llama_parity_tool CHECKPOINT_FOLDER BATCHES OUT\n");
    return 2;
  }
  const std::string folder = argv[1];
  absl::StatusOr<models::LlamaConfig> cfg = models::ReadHfLlamaConfig(folder);
  if (!cfg.ok()) return Fail(cfg.status());
  models::Llama model(*cfg);
  absl::StatusOr<std::map<std::string, Tensor>> weights = LoadHfWeights(folder, model);
  if (!weights.ok()) return Fail(weights.status());
  if (absl::Status st = model.LoadStateDict(*weights); !st.ok()) return Fail(st);

  absl::StatusOr<std::map<std::string, Tensor>> batches = LoadSafetensors(argv[2]);
  if (!batches.ok()) return Fail(batches.status());
  const Tensor ids = batches->at("ids"), targets = batches->at("targets");
  const int64_t steps = ids.size(0), b = ids.size(1), t = ids.size(2);

  ParamGroup decay, no_decay;
  decay.weight_decay = 0.1f;
  for (auto& [name, p] : model.NamedParameters()) (p.weight_decay() ? decay : no_decay).params.push_back(p);
  AdamWOptions adam;
  adam.beta1 = 0.9f;
  adam.beta2 = 0.95f;
  adam.eps = 1e-8f;
  std::unique_ptr<Optimizer> opt = MakeAdamW({decay, no_decay}, adam);

  std::map<std::string, Tensor> out;
  {
    autograd::NoGradGuard ng;
    out["logits"] = model(ids.Slice(0, 1).Reshape({b, t})).Detach().Clone();
  }
  std::vector<float> losses;
  for (int64_t s = 0; s < steps; ++s) {
    opt->ZeroGrad();
    Tensor loss = ops::CrossEntropy(model(ids.Slice(s, s + 1).Reshape({b, t})),
                                    targets.Slice(s, s + 1).Reshape({b, t}));
    loss.Backward();
    opt->Step();
    losses.push_back(loss.item());
  }
  out["losses"] = Tensor::FromVector(losses, {steps});
  for (auto& [name, p] : model.NamedParameters()) out["final." + name] = p.Detach().Clone();
  if (absl::Status st = SaveSafetensors(argv[3], out); !st.ok()) return Fail(st);
  return 0;
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) { return braid::Main(argc, argv); }
