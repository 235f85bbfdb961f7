// GPT-2's pre-tokenization: text is cut into pieces before BPE merges anything, and no merge
// crosses a piece boundary. GPT-2 does it with the regular expression
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// which this file implements by hand (a regex engine would need look-ahead, and a hand-written
// scanner is several times faster). The semantics are those of tiktoken, OpenAI's reference:
//   - \p{L}, \p{N}: Unicode general categories L* and N* (ICU's tables);
//   - \s: the Unicode White_Space property (so U+0085 is white space and U+FEFF is not; the
//     JavaScript ports js-tiktoken and gpt-3-encoder use JavaScript's \s and differ there);
//   - the contractions are lower case only ("'S" is two pieces, "'" and "S").
// Bytes that are not valid UTF-8 (stray continuation bytes, overlong forms, surrogates, cut
// sequences) count one byte at a time as "other" characters, the class of punctuation, so any
// byte string is cut, and the pieces always concatenate back to the input.
#ifndef BRAID_MODELS_TEXT_GPT2_PRETOKENIZER_H_
#define BRAID_MODELS_TEXT_GPT2_PRETOKENIZER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace braid::text {

// The end of the piece that starts at `pos` (< text.size()); always > pos.
size_t Gpt2PieceEnd(absl::string_view text, size_t pos);

// Every piece of `text`, in order (tests and tools; the tokenizer walks Gpt2PieceEnd itself).
std::vector<std::string> Gpt2Pieces(absl::string_view text);

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_GPT2_PRETOKENIZER_H_
