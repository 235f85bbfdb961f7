// What safetensors.cc (laying out, writing and reading files) shares with safetensors_json.cc
// (the strict JSON a header is parsed with, and the UTF-8 check names go through). Internal to
// :safetensors: safetensors.h stays free of JSON, which none of its users need.
#ifndef BRAID_PLUGINS_CHECKPOINT_SAFETENSORS_INTERNAL_H_
#define BRAID_PLUGINS_CHECKPOINT_SAFETENSORS_INTERNAL_H_

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace braid::safetensors_internal {

using Json = nlohmann::json;

std::string KindName(const Json& v);

// Offset of the first byte that is not part of well-formed UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos. nlohmann checks the strings it parses too, but
// this names the byte, and SaveSafetensors checks names with it before anything is written.
size_t FindInvalidUtf8(const std::string& s);

// Parses `text` (valid UTF-8) as one strict RFC 8259 JSON document: no comments, no trailing
// commas, no NaN, nothing after the value, no duplicate keys, at most kMaxJsonDepth levels
// (safetensors_json.cc).
absl::StatusOr<Json> ParseJson(const std::string& text);

// A JSON number that is a non-negative integer below 2^63 (what offsets and dimensions are).
// Integers only as written without a fraction or exponent (1.0 and 1e3 are floating for
// nlohmann); "-0" is 0, as for the reference implementation's reader.
bool ToIndex(const Json& v, uint64_t* out);

// What a header value was, for errors: a number as written, anything else by its kind.
std::string Describe(const Json& v);

}  // namespace braid::safetensors_internal

#endif  // BRAID_PLUGINS_CHECKPOINT_SAFETENSORS_INTERNAL_H_
