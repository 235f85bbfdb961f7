// GPT-2's files spell token bytes as printable characters: each byte is one Unicode character,
// itself for the 188 printable Latin-1 bytes and U+0100 onwards, in byte order, for the rest
// (so a space is 'Ġ', U+0120). This maps between the two.
#ifndef BRAID_MODELS_TEXT_BYTE_UNICODE_H_
#define BRAID_MODELS_TEXT_BYTE_UNICODE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::text {

// The character that stands for byte `b`.
uint32_t ByteToUnicode(unsigned char b);

// The bytes a file's token spelling (UTF-8) stands for; InvalidArgument when it is not UTF-8 or
// uses a character that stands for no byte.
absl::StatusOr<std::string> BytesFromGpt2Spelling(absl::string_view spelling);

}  // namespace braid::text

#endif  // BRAID_MODELS_TEXT_BYTE_UNICODE_H_
