// The training FLOPs per token the MFU is computed from (TrainFlopsPerToken), against a count by
// hand for one small shape, and through the model's registration.
#include <memory>

#include "core/config/sections.pb.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"

namespace braid::models {
namespace {

GptConfig Small() {
  GptConfig c;
  c.vocab_size = c.padded_vocab_size = 16;
  c.block_size = 4;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

TEST(TrainFlopsPerToken, HandCountOfASmallShape) {
  // d = 8, L = 2, T = 4, V = 16. Parameters, the position embedding (4 x 8) left out:
  //   wte                          16 x 8          = 128
  //   per block: ln_1              8 + 8           =  16
  //              attn.c_attn       8 x 24 + 24     = 216
  //              attn.c_proj       8 x 8 + 8       =  72
  //              ln_2              8 + 8           =  16
  //              mlp.c_fc          8 x 32 + 32     = 288
  //              mlp.c_proj        32 x 8 + 8      = 264   -> 872 per block, 1744 for two
  //   ln_f                         8 + 8           =  16
  //   N = 128 + 1744 + 16 = 1888
  // 6 N = 11328; attention 12 x L x d x T = 12 x 2 x 8 x 4 = 768; total 12096.
  EXPECT_EQ(TrainFlopsPerToken(Small()), 12096.0);
}

TEST(TrainFlopsPerToken, CountsTheModelsOwnParameters) {
  for (bool stable : {false, true}) {
    GptConfig c = Small();
    c.stable_embedding = stable;
    Gpt g(c);
    const double n = double(g.NumParameters() - c.block_size * c.n_embd);  // less wpe
    EXPECT_EQ(TrainFlopsPerToken(c), 6 * n + 12.0 * 2 * 8 * 4) << "stable_embedding " << stable;
  }
}

TEST(TrainFlopsPerToken, TheRegistrationSuppliesIt) {
  absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel("gpt-mini");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->train_flops_per_token != nullptr);
  config::ModelConfig m;
  m.set_name("gpt-mini");
  m.set_n_layer(2);
  m.set_n_head(2);
  m.set_n_embd(8);
  m.set_block_size(4);
  m.set_vocab_size(256);  // gpt-mini's own: 256 rows, no padding
  GptConfig c = Small();
  c.vocab_size = c.padded_vocab_size = 256;
  EXPECT_EQ(spec->train_flops_per_token(m), TrainFlopsPerToken(c));
  EXPECT_EQ(TrainFlopsPerToken(c), 12096.0 + 6 * (256 - 16) * 8);
}

}  // namespace
}  // namespace braid::models
