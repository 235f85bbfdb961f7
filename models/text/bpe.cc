#include "models/text/bpe.h"

#include <algorithm>
#include <queue>

#include "absl/strings/str_cat.h"

namespace braid::text {
namespace {

// Pieces up to this many bytes merge by plain scans (fewer allocations, better locality); longer
// ones through the heap. Either gives the same ids (bpe_test checks both on the same pieces).
constexpr size_t kShortPiece = 64;

}  // namespace

absl::StatusOr<BpeModel> BpeModel::Build(
    std::vector<std::string> tokens,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  BpeModel m;
  m.tokens_ = std::move(tokens);
  m.ranks_.assign(m.tokens_.size(), kNoRank);
  absl::flat_hash_map<std::string, uint32_t> all;  // every token, special ones included
  all.reserve(m.tokens_.size());
  for (uint32_t id = 0; id < m.tokens_.size(); ++id) {
    const std::string& t = m.tokens_[id];
    if (t.empty()) return absl::InvalidArgumentError(absl::StrCat("token ", id, " is empty"));
    auto [it, inserted] = all.emplace(t, id);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens ", it->second, " and ", id, " have the same bytes"));
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = all.find(std::string(1, static_cast<char>(b)));
    if (it == all.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no token for the byte ", b, ": a byte-level vocabulary needs all 256"));
    }
    m.byte_ids_[b] = it->second;
    m.ids_.emplace(it->first, it->second);
  }
  for (uint32_t r = 0; r < merges.size(); ++r) {
    const auto& [left, right] = merges[r];
    auto l = all.find(left), rt = all.find(right), t = all.find(left + right);
    if (l == all.end() || rt == all.end() || t == all.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "merge ", r + 1, " ('", left, "' + '", right, "'): ",
          t == all.end() ? "the merged token is not in the vocabulary"
                         : "one of its parts is not in the vocabulary"));
    }
    if (m.ranks_[t->second] != kNoRank) {
      return absl::InvalidArgumentError(absl::StrCat("merge ", r + 1, " ('", left, "' + '",
                                                     right, "') makes a token that merge ",
                                                     m.ranks_[t->second] + 1, " already made"));
    }
    m.ranks_[t->second] = r;
    m.ids_.emplace(t->first, t->second);
  }
  // Every way to write each ranked token as two ordinary tokens side by side: tiktoken merges
  // any adjacent pair whose bytes form a ranked token, not only the pair its merge line names.
  for (uint32_t id = 0; id < m.tokens_.size(); ++id) {
    if (m.ranks_[id] == kNoRank) continue;
    const std::string& t = m.tokens_[id];
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = m.ids_.find(absl::string_view(t).substr(0, k));
      auto r = m.ids_.find(absl::string_view(t).substr(k));
      if (l == m.ids_.end() || r == m.ids_.end()) continue;
      m.pairs_.emplace((uint64_t{l->second} << 32) | r->second, Merged{m.ranks_[id], id});
    }
  }
  return m;
}

void BpeModel::EncodePiece(absl::string_view piece, std::vector<uint32_t>* out) const {
  auto it = ids_.find(piece);
  if (it != ids_.end()) {
    out->push_back(it->second);
  } else if (piece.size() <= kShortPiece) {
    MergeShort(piece, out);
  } else {
    MergeLong(piece, out);
  }
}

void BpeModel::MergeShort(absl::string_view piece, std::vector<uint32_t>* out) const {
  // parts[i]: the current token; rank[i]: the rank of merging parts i and i + 1.
  uint32_t parts[kShortPiece], rank[kShortPiece], merged[kShortPiece];
  if (piece.size() > kShortPiece) return MergeLong(piece, out);
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) parts[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  auto fill = [&](size_t i) {
    const Merged* m = Pair(parts[i], parts[i + 1]);
    rank[i] = m ? m->rank : kNoRank;
    merged[i] = m ? m->id : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) fill(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;  // strict: the leftmost minimum wins
    }
    if (rank[best] == kNoRank) break;
    parts[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      parts[i] = parts[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best + 1 < n) fill(best);
    if (best > 0) fill(best - 1);
  }
  out->insert(out->end(), parts, parts + n);
}

void BpeModel::MergeLong(absl::string_view piece, std::vector<uint32_t>* out) const {
  const size_t n = piece.size();
  // A doubly linked list of parts, indexed by the position of their first byte; a part that was
  // merged into its left neighbour has id kNoRank.
  std::vector<uint32_t> id(n), next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i) - 1;  // wraps for 0; never read there
  }
  // (rank, left position, left id, right id): an entry is stale once either part has changed,
  // which the ids show, since a merge always changes the left part's id and retires the right.
  struct Entry {
    uint32_t rank, pos, left, right;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Entry> storage;
  storage.reserve(n);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(
      std::greater<Entry>(), std::move(storage));
  auto push = [&](uint32_t pos) {
    uint32_t r = next[pos];
    if (r >= n) return;
    if (const Merged* m = Pair(id[pos], id[r])) heap.push({m->rank, pos, id[pos], id[r]});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    uint32_t r = next[e.pos];
    if (id[e.pos] != e.left || r >= n || id[r] != e.right) continue;  // stale
    id[e.pos] = Pair(e.left, e.right)->id;
    id[r] = kNoRank;
    next[e.pos] = next[r];
    if (next[r] < n) prev[next[r]] = e.pos;
    push(e.pos);
    if (e.pos > 0) push(prev[e.pos]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out->push_back(id[i]);
}

}  // namespace braid::text
