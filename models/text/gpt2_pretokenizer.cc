#include "models/text/gpt2_pretokenizer.h"

#include <unicode/uchar.h>

#include <cstdint>

namespace braid::text {
namespace {

// The classes the expression distinguishes. kOther is [^\s\p{L}\p{N}], invalid bytes included.
enum Class : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Char {
  uint32_t len;  // bytes
  Class cls;
};

// ASCII, the bulk of most text, from a table instead of ICU.
struct AsciiTable {
  Class cls[128];
  constexpr AsciiTable() : cls() {
    for (int c = 0; c < 128; ++c) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        cls[c] = kLetter;
      } else if (c >= '0' && c <= '9') {
        cls[c] = kNumber;
      } else if (c == ' ' || (c >= '\t' && c <= '\r')) {  // White_Space in ASCII
        cls[c] = kSpace;
      } else {
        cls[c] = kOther;
      }
    }
  }
};
constexpr AsciiTable kAscii;

Class ClassOf(UChar32 c) {
  uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return kLetter;
  if (mask & U_GC_N_MASK) return kNumber;
  if (u_isUWhiteSpace(c)) return kSpace;
  return kOther;
}

inline bool Cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// The character at `pos`: a well-formed UTF-8 sequence (shortest form, no surrogates, at most
// U+10FFFF), or else the single byte at `pos` as kOther.
inline Char At(const unsigned char* s, size_t n, size_t pos) {
  unsigned char b0 = s[pos];
  if (b0 < 0x80) return {1, kAscii.cls[b0]};
  size_t left = n - pos;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left >= 2 && Cont(s[pos + 1])) {
      return {2, ClassOf(((b0 & 0x1F) << 6) | (s[pos + 1] & 0x3F))};
    }
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left >= 3 && Cont(s[pos + 1]) && Cont(s[pos + 2])) {
      UChar32 c = ((b0 & 0x0F) << 12) | ((s[pos + 1] & 0x3F) << 6) | (s[pos + 2] & 0x3F);
      if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) return {3, ClassOf(c)};
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left >= 4 && Cont(s[pos + 1]) && Cont(s[pos + 2]) && Cont(s[pos + 3])) {
      UChar32 c = ((b0 & 0x07) << 18) | ((s[pos + 1] & 0x3F) << 12) |
                  ((s[pos + 2] & 0x3F) << 6) | (s[pos + 3] & 0x3F);
      if (c >= 0x10000 && c <= 0x10FFFF) return {4, ClassOf(c)};
    }
  }
  return {1, kOther};
}

// The end of the run of characters of class `cls` that starts at `pos`.
inline size_t RunEnd(const unsigned char* s, size_t n, size_t pos, Class cls) {
  while (pos < n) {
    Char c = At(s, n, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

}  // namespace

size_t Gpt2PieceEnd(absl::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // 's 't 're 've 'm 'll 'd
  if (s[pos] == '\'' && pos + 1 < n) {
    unsigned char a = s[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (pos + 2 < n) {
      unsigned char b = s[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return pos + 3;
      }
    }
  }
  Char first = At(s, n, pos);
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": one optional space, then a run of one class.
  if (s[pos] == ' ' && pos + 1 < n) {
    Char next = At(s, n, pos + 1);
    if (next.cls != kSpace) return RunEnd(s, n, pos + 1 + next.len, next.cls);
  }
  if (first.cls != kSpace) return RunEnd(s, n, pos + first.len, first.cls);
  // "\s+(?!\S)": the white space run, less its last character when something other than white
  // space follows (that character then starts the next piece, e.g. " word"); "\s+" when the run
  // is a single character.
  size_t end = pos + first.len;
  size_t last = pos;
  while (end < n) {
    Char c = At(s, n, end);
    if (c.cls != kSpace) break;
    last = end;
    end += c.len;
  }
  if (end == n || last == pos) return end;
  return last;
}

std::vector<std::string> Gpt2Pieces(absl::string_view text) {
  std::vector<std::string> pieces;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = Gpt2PieceEnd(text, pos);
    pieces.emplace_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

}  // namespace braid::text
