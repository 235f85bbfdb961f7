// The JSON side of the safetensors format: a strict parser for headers and the checks and
// descriptions the reader's errors use. Apart from safetensors.cc because it is a parser of its
// own (nlohmann's SAX interface under stricter rules), independent of files and tensors.
//
// JSON, through nlohmann/json (Debian's nlohmann-json3-dev). The header is parsed with its SAX
// interface into a tree of our own making rather than with json::parse, for what the format
// needs and json::parse does not give: duplicate keys are errors (json::parse keeps the last
// one), nesting is bounded (a hostile header of 100 MB of '[' should not build 50 million
// nested arrays), and no exception is thrown (errors arrive in parse_error and become a
// Status). Numbers keep nlohmann's distinction between unsigned, signed and floating, so offsets
// and dimensions are exact 64-bit integers and 3.0 is not taken for 3.
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plugins/checkpoint/safetensors_internal.h"

namespace braid::safetensors_internal {

std::string KindName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
    case Json::value_t::array:
      return absl::StrCat("an ", v.type_name());
    case Json::value_t::null:
      return "null";
    default:
      return absl::StrCat("a ", v.type_name());
  }
}

size_t FindInvalidUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const uint8_t c = uint8_t(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const uint8_t cc = uint8_t(s[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string::npos;
}

namespace {

constexpr int kMaxJsonDepth = 64;

// nlohmann's description of a syntax error, without its "[json.exception...] parse error at
// line 1, column N: " prefix (we give a byte offset instead), in the header's terms, and with a
// long "last read" token (a whole string up to the bad byte) cut to its end.
std::string DescribeSyntaxError(const std::string& what) {
  std::string msg = what;
  if (size_t id_end = msg.find("] "); msg.rfind("[json.exception.", 0) == 0 && id_end != msg.npos) {
    msg = msg.substr(id_end + 2);
  }
  if (size_t colon = msg.find(": "); msg.rfind("parse error", 0) == 0 && colon != msg.npos) {
    msg = msg.substr(colon + 2);
  }
  static constexpr const char* kLastRead = "; last read: '";
  if (size_t begin = msg.find(kLastRead); begin != std::string::npos) {
    begin += std::strlen(kLastRead);
    size_t end = msg.find("'; expected", begin);
    if (end == std::string::npos) end = msg.size() - 1;  // ends with the closing quote
    constexpr size_t kKeep = 40;
    if (end > begin + kKeep) {
      size_t from = end - kKeep;
      while (from < end && (uint8_t(msg[from]) & 0xc0) == 0x80) ++from;  // whole characters
      msg.replace(begin, from - begin, "...");
    }
  }
  static constexpr std::pair<const char*, const char*> kRewrites[] = {
      {"end of input", "end of the header"},
      {"surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF",
       "a high surrogate (\\ud800-\\udbff) must be followed by a low surrogate (\\udc00-\\udfff)"},
      {"surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF",
       "a low surrogate (\\udc00-\\udfff) must follow a high surrogate (\\ud800-\\udbff)"},
  };
  for (const auto& [from, to] : kRewrites) {
    for (size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at)) {
      msg.replace(at, std::strlen(from), to);
      at += std::strlen(to);
    }
  }
  return msg;
}

// Builds the Json tree of one document, refusing duplicate keys and deep nesting. Containers
// are filled in place: `open_` holds the containers being filled, innermost last (pointers stay
// valid: only the innermost container grows), and `slot_` the member a key just made.
class StrictJsonBuilder final : public nlohmann::json_sax<Json> {
 public:
  explicit StrictJsonBuilder(Json* root) : root_(root) {}

  // Why parsing stopped ("at byte 20 of the header: ..."); empty while none.
  const std::string& error() const { return error_; }

  bool null() override { return Put(nullptr); }
  bool boolean(bool v) override { return Put(v); }
  bool number_integer(number_integer_t v) override { return Put(v); }
  bool number_unsigned(number_unsigned_t v) override { return Put(v); }
  bool number_float(number_float_t v, const string_t&) override { return Put(v); }
  bool string(string_t& v) override { return Put(std::move(v)); }
  bool binary(binary_t&) override { return Fail("binary data, which JSON does not have"); }
  bool start_object(std::size_t) override { return Open(Json::object()); }
  bool start_array(std::size_t) override { return Open(Json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    auto [it, inserted] = open_.back()->get_ref<Json::object_t&>().emplace(k, nullptr);
    if (!inserted) return Fail(absl::StrCat("the key \"", k, "\" appears twice in one object"));
    slot_ = &it->second;
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const Json::exception& e) override {
    // `position` counts the bytes read, the offending one included.
    error_ = absl::StrCat("at byte ", position == 0 ? 0 : position - 1,
                          " of the header: ", DescribeSyntaxError(e.what()));
    return false;
  }

 private:
  // Stores a value where the document's grammar puts it: the root, the end of the innermost
  // open array, or the member the last key made.
  bool Put(Json v) {
    Place(std::move(v));
    return true;
  }

  Json* Place(Json v) {
    if (open_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      auto& items = parent.get_ref<Json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool Open(Json container) {
    if (open_.size() >= size_t(kMaxJsonDepth)) {
      return Fail(absl::StrCat("the JSON is nested more than ", kMaxJsonDepth,
                               " levels deep; a safetensors header needs 3"));
    }
    open_.push_back(Place(std::move(container)));
    return true;
  }

  bool Close() {
    open_.pop_back();
    return true;
  }

  bool Fail(std::string why) {
    error_ = std::move(why);
    return false;
  }

  Json* root_;
  std::vector<Json*> open_;
  Json* slot_ = nullptr;
  std::string error_;
};

}  // namespace

absl::StatusOr<Json> ParseJson(const std::string& text) {
  Json root;
  StrictJsonBuilder builder(&root);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &builder, Json::input_format_t::json,
                         /*strict=*/true, /*ignore_comments=*/false);
  } catch (const std::exception& e) {  // not expected: SAX parsing reports errors, not throws
    return absl::InvalidArgumentError(e.what());
  }
  if (!ok) {
    return absl::InvalidArgumentError(builder.error().empty() ? "malformed JSON" : builder.error());
  }
  return root;
}

bool ToIndex(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (x > uint64_t(INT64_MAX)) return false;
    *out = x;
    return true;
  }
  if (!v.is_number_integer() || v.get<int64_t>() < 0) return false;
  *out = uint64_t(v.get<int64_t>());
  return true;
}

std::string Describe(const Json& v) { return v.is_number() ? v.dump() : KindName(v); }

}  // namespace braid::safetensors_internal
