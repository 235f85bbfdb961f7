#include "models/text/bpe_reference.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "models/text/gpt2_pretokenizer.h"

namespace braid::text {

std::vector<uint32_t> ReferenceEncodePiece(const BpeModel& model, absl::string_view piece) {
  if (uint32_t id = model.Find(piece); id != BpeModel::kNoRank) return {id};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    uint32_t best_rank = BpeModel::kNoRank;
    size_t best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      uint32_t id = model.Find(parts[i] + parts[i + 1]);
      if (id == BpeModel::kNoRank || model.rank(id) == BpeModel::kNoRank) continue;
      if (model.rank(id) < best_rank) {
        best_rank = model.rank(id);
        best = i;
      }
    }
    if (best_rank == BpeModel::kNoRank) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + best + 1);
  }
  std::vector<uint32_t> ids;
  for (const std::string& p : parts) ids.push_back(model.Find(p));
  return ids;
}

namespace {

constexpr char kTrainingText[] =
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money "
    "in my purse, and nothing particular to interest me on shore, I thought I would sail about "
    "a little and see the watery part of the world. It's a way I have; they'll say we've seen "
    "it, I'd think, you're sure. aaaa aaaaaaa aaaaaaaaaaaaaaa abababab abababababab aaabaaab "
    "zzzzzz zz z 1234567890 123 456 7890 000000 2024-11-27 3.14159 "
    "Ça été très bien, déjà vu: naïve café résumé über straße Größe "
    "Привет мир, как дела? Привет привет "
    "日本語のテキスト、日本語の文章。東京 "
    "مرحبا بالعالم "
    "😀😀 👍🏽 👨‍👩‍👧 \t\t  \r\n\r\n    indented code(x) { return x + 1; } \n\n\n "
    "the the the then there these those other another mother brother rather";

}  // namespace

BpeModel ToyModel(int num_merges) {
  std::map<std::vector<std::string>, int> words;
  for (const std::string& p : Gpt2Pieces(kTrainingText)) {
    std::vector<std::string> w;
    for (char c : p) w.emplace_back(1, c);
    ++words[w];
  }
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  std::set<std::string> known(tokens.begin(), tokens.end());
  std::vector<std::pair<std::string, std::string>> merges;
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& [w, n] : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) counts[{w[i], w[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 0;
    for (const auto& [pair, n] : counts) {
      // A string is made by one merge only (as in GPT-2's files); the pair that would make it
      // again is left to encoding, which merges it anyway (bpe.h).
      if (n > best_count && !known.count(pair.first + pair.second)) {
        best_count = n;
        best = &pair;
      }
    }
    if (best == nullptr) break;
    const std::pair<std::string, std::string> merge = *best;
    merges.push_back(merge);
    tokens.push_back(merge.first + merge.second);
    known.insert(tokens.back());
    std::map<std::vector<std::string>, int> next;
    for (const auto& [w, n] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == merge.first && w[i + 1] == merge.second) {
          out.push_back(merge.first + merge.second);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      next[out] += n;
    }
    words = std::move(next);
  }
  tokens.push_back("<|endoftext|>");
  absl::StatusOr<BpeModel> model = BpeModel::Build(std::move(tokens), merges);
  if (!model.ok()) __builtin_trap();  // the training above always gives a valid vocabulary
  return *std::move(model);
}

}  // namespace braid::text
