// Any bytes through the GPT-2 pre-tokenizer and BPE with the toy vocabulary of bpe_reference.h:
// the pieces concatenate back to the input, each piece's ids equal the slow reference's (short
// pieces; the reference is quadratic) and the two merge loops agree, and the ids decode back to
// the input (decode(encode(x)) == x). Traps on the first difference.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "models/text/bpe.h"
#include "models/text/bpe_reference.h"
#include "models/text/gpt2_pretokenizer.h"

using braid::text::BpeModel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const BpeModel* model = new BpeModel(braid::text::ToyModel());
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<uint32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = braid::text::Gpt2PieceEnd(text, pos);
    if (end <= pos || end > text.size()) __builtin_trap();
    absl::string_view piece = text.substr(pos, end - pos);
    size_t first = ids.size();
    model->EncodePiece(piece, &ids);
    if (piece.size() <= 200) {
      std::vector<uint32_t> mine(ids.begin() + first, ids.end());
      if (mine != braid::text::ReferenceEncodePiece(*model, piece)) __builtin_trap();
      std::vector<uint32_t> short_ids, long_ids;
      model->MergeShort(piece, &short_ids);
      model->MergeLong(piece, &long_ids);
      if (short_ids != long_ids) __builtin_trap();
    }
    pos = end;
  }
  std::string back;
  for (uint32_t id : ids) {
    if (id >= model->size()) __builtin_trap();
    back += model->token(id);
  }
  if (back != text) __builtin_trap();
  return 0;
}
