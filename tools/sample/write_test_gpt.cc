// write_test_gpt OUT.safetensors VOCAB_ROWS SEED: a small GPT (tools/sample/test_gpt.h) for
// sample_test.sh, with its head count in the metadata as the trainer's save_to writes it.
#include <cstdlib>
#include <iostream>

#include "core/safetensors.h"
#include "tools/sample/test_gpt.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: write_test_gpt OUT.safetensors VOCAB_ROWS SEED\n";
    return 2;
  }
  auto g = braid::tools::TestGpt(std::strtoull(argv[3], nullptr, 10), std::atoll(argv[2]));
  absl::Status st = braid::SaveSafetensors(argv[1], g->StateDict(), {{"n_head", "4"}});
  if (!st.ok()) {
    std::cerr << st << "\n";
    return 1;
  }
  return 0;
}
