// write_test_model gpt|llama OUT.safetensors VOCAB_ROWS SEED: a small GPT (test_gpt.h, its head
// count in the metadata as the trainer's save_to writes it) or Llama (test_llama.h) for
// sample_test.sh.
#include <cstdlib>
#include <iostream>
#include <string>

#include "plugins/checkpoint/safetensors.h"
#include "tools/sample/test_gpt.h"
#include "tools/sample/test_llama.h"

int main(int argc, char** argv) {
  const std::string kind = argc == 5 ? argv[1] : "";
  if (kind != "gpt" && kind != "llama") {
    std::cerr << "usage: write_test_model gpt|llama OUT.safetensors VOCAB_ROWS SEED\n";
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
  const int64_t rows = std::atoll(argv[3]);
  absl::Status st =
      kind == "gpt"
          ? braid::SaveSafetensors(argv[2], braid::tools::TestGpt(seed, rows)->StateDict(),
                                   {{"n_head", "4"}})
          : braid::SaveSafetensors(argv[2], braid::tools::TestLlama(seed, rows)->StateDict());
  if (!st.ok()) {
    std::cerr << st << "\n";
    return 1;
  }
  return 0;
}
