#include "tools/sample/load_gpt.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::tools {

absl::StatusOr<models::GptConfig> GptConfigFromWeights(const LoadedWeights& w, int n_head) {
  auto shape = [&](const std::string& name) -> const Shape* {
    auto f = w.tensors.find(name);
    return f == w.tensors.end() ? nullptr : &f->second.shape();
  };
  const Shape* wte = shape("wte.weight");
  const Shape* wpe = shape("wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->size() != 2 || wpe->size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        w.source, " holds no GPT weights (wte.weight and wpe.weight, 2-D); is it a GPT's?"));
  }
  models::GptConfig c;
  c.padded_vocab_size = (*wte)[0];
  c.vocab_size = c.padded_vocab_size;  // the tokenizer says how many of the rows are real
  c.n_embd = (*wte)[1];
  c.block_size = (*wpe)[0];
  c.n_layer = 0;
  while (shape(absl::StrCat("h.", c.n_layer, ".ln_1.weight")) != nullptr) ++c.n_layer;
  c.stable_embedding = shape("wte_norm.weight") != nullptr;
  if (n_head <= 0) {
    auto meta = w.metadata.find("n_head");
    if (meta != w.metadata.end() && !absl::SimpleAtoi(meta->second, &n_head)) n_head = 0;
  }
  if (n_head <= 0) {
    for (const models::GptConfig& p : {models::GptConfig::Mini(), models::GptConfig::Gpt2_124M()}) {
      if (p.n_embd == c.n_embd) n_head = int(p.n_head);
    }
  }
  if (n_head <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        w.source, ": width ", c.n_embd, " matches no preset and the file names no n_head; pass --n_head"));
  }
  if (c.n_embd % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(w.source, ": n_head ", n_head,
                                                   " does not divide the width ", c.n_embd));
  }
  c.n_head = n_head;
  return c;
}

absl::StatusOr<std::unique_ptr<models::Gpt>> LoadGpt(const std::string& path, int n_head) {
  BRAID_ASSIGN_OR_RETURN(LoadedWeights w, LoadWeights(path));
  // PyTorch's nanoGPT state dict carries the tied head under its own name too; it is wte.
  w.tensors.erase("lm_head.weight");
  BRAID_ASSIGN_OR_RETURN(models::GptConfig c, GptConfigFromWeights(w, n_head));
  auto gpt = std::make_unique<models::Gpt>(c);
  absl::Status st = gpt->LoadStateDict(w.tensors, /*strict=*/true);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(w.source, " does not fit a GPT of ", c.n_layer,
                                                   " layers x ", c.n_embd, ": ", st.message()));
  }
  gpt->Eval();
  return gpt;
}

}  // namespace braid::tools
