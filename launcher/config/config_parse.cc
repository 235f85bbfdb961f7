// Reading a training config (text format, JSON, a file) and printing one: the first step in
// config.h, with the error messages that name the origin, position and field. Separate from
// validation (config.cc), which works on an already parsed TrainConfig.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "launcher/config/config.h"
#include "launcher/config/config_internal.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace braid::config {
namespace {

namespace pb = google::protobuf;

using internal::Quoted;

std::string KnownFields(const pb::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

// The text of line `line` (0-based) of `text`.
std::string LineOf(const std::string& text, int line) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  return line >= 0 && line < static_cast<int>(lines.size()) ? lines[line] : std::string();
}

// The protobuf tokenizer's columns advance a tab to the next multiple of 8; this maps one back
// to a byte offset in the line.
size_t ByteOffsetOfColumn(const std::string& line, int column) {
  int col = 0;
  size_t i = 0;
  for (; i < line.size() && col < column; ++i) col = line[i] == '\t' ? (col / 8 + 1) * 8 : col + 1;
  return i;
}

int ColumnOfByteOffset(const std::string& line, size_t offset) {
  int col = 0;
  for (size_t i = 0; i < offset && i < line.size(); ++i) {
    col = line[i] == '\t' ? (col / 8 + 1) * 8 : col + 1;
  }
  return col;
}

bool IsIdentChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The text parser reports a position but not the field it was parsing. The field is the
// identifier that ends at the position (unknown or repeated field name) or the one before the
// ':' preceding it (bad value); empty if neither.
std::string FieldNear(const std::string& line, size_t pos) {
  pos = std::min(pos, line.size());
  auto skip_space = [&] {
    while (pos > 0 && absl::ascii_isspace(static_cast<unsigned char>(line[pos - 1]))) --pos;
  };
  if (pos == 0 || !IsIdentChar(line[pos - 1])) {
    skip_space();
    if (pos == 0 || line[pos - 1] != ':') return "";
    --pos;
    skip_space();
  }
  size_t end = pos;
  while (pos > 0 && IsIdentChar(line[pos - 1])) --pos;
  return line.substr(pos, end - pos);
}

class TextErrorCollector : public pb::io::ErrorCollector {
 public:
  TextErrorCollector(const std::string& text, const std::string& origin)
      : text_(text), origin_(origin) {}

  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    const std::string line_text = LineOf(text_, line);
    const size_t offset = ByteOffsetOfColumn(line_text, column);
    // Protobuf names the unknown field and its message type; add what would have been valid.
    const std::string kPrefix = "Message type \"", kMiddle = "\" has no field named \"";
    size_t middle = message.find(kMiddle);
    if (absl::StartsWith(message, kPrefix) && middle != std::string::npos) {
      std::string type = message.substr(kPrefix.size(), middle - kPrefix.size());
      std::string field = message.substr(middle + kMiddle.size());
      field = field.substr(0, field.find('"'));
      // Protobuf points after the name (at the next token for a message field); editors want
      // the name's start.
      size_t end = offset;
      while (end > 0 && absl::ascii_isspace(static_cast<unsigned char>(line_text[end - 1]))) --end;
      if (end >= field.size() && line_text.compare(end - field.size(), field.size(), field) == 0) {
        column = ColumnOfByteOffset(line_text, end - field.size());
      }
      const std::string where = absl::StrCat(origin_, ":", line + 1, ":", column + 1, ": ");
      const pb::Descriptor* d = pb::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
      errors_.push_back(absl::StrCat(where, "unknown field \"", field, "\" in ", type,
                                     d ? absl::StrCat(" (known fields: ", KnownFields(d), ")") : "",
                                     "; remove it or fix its spelling"));
      return;
    }
    const std::string where = absl::StrCat(origin_, ":", line + 1, ":", column + 1, ": ");
    const std::string field = FieldNear(line_text, offset);
    if (!field.empty() && message.find(absl::StrCat("\"", field, "\"")) == std::string::npos) {
      errors_.push_back(absl::StrCat(where, "field \"", field, "\": ", message));
    } else {
      errors_.push_back(absl::StrCat(where, message));
    }
  }

  void AddWarning(int line, pb::io::ColumnNumber column, const std::string& message) override {}

  std::string Errors() const { return absl::StrJoin(errors_, "; "); }

 private:
  const std::string& text_;
  const std::string& origin_;
  std::vector<std::string> errors_;
};

// Resolves a dotted path of field names ("optimizer.params") from TrainConfig; null if a part is
// not a message field.
const pb::Descriptor* DescriptorAt(const std::string& path) {
  const pb::Descriptor* d = TrainConfig::descriptor();
  if (path.empty()) return d;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(path, '.'))) {
    const pb::FieldDescriptor* f = d->FindFieldByName(part);
    for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
      if (d->field(i)->json_name() == part) f = d->field(i);
    }
    if (f == nullptr || f->message_type() == nullptr) return nullptr;
    d = f->message_type();
  }
  return d;
}

// " at line L, column C" if `"key":` occurs exactly once in `text` (protobuf's JSON errors carry
// no position; an ambiguous key gets none rather than a wrong one).
std::string JsonKeyPosition(const std::string& text, const std::vector<std::string>& keys) {
  int found = 0;
  size_t at = 0;
  for (const std::string& key : keys) {
    const std::string quoted = absl::StrCat("\"", key, "\"");
    for (size_t p = text.find(quoted); p != std::string::npos; p = text.find(quoted, p + 1)) {
      size_t q = p + quoted.size();
      while (q < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[q]))) ++q;
      if (q < text.size() && text[q] == ':') {
        ++found;
        at = p;
      }
    }
  }
  if (found != 1) return "";
  int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
  size_t line_start = text.rfind('\n', at);
  size_t column = at - (line_start == std::string::npos ? 0 : line_start + 1) + 1;
  return absl::StrCat(":", line, ":", column);
}

std::vector<std::string> NameAndJsonName(const std::string& path, const std::string& name) {
  std::vector<std::string> names = {name};
  if (const pb::Descriptor* d = DescriptorAt(path)) {
    if (const pb::FieldDescriptor* f = d->FindFieldByName(name)) {
      if (f->json_name() != name) names.push_back(f->json_name());
    }
  }
  return names;
}

// Rewrites protobuf's JSON errors, "(optimizer.params) bogus: Cannot find field." and
// "(optimizer.params.lr): invalid value \"x\" for type TYPE_DOUBLE", to name the file, the full
// field path, and where possible the position and the valid fields.
std::string DescribeJsonError(const std::string& text, const std::string& origin,
                              const std::string& message) {
  std::string path, rest = message;
  if (absl::StartsWith(rest, "(")) {
    size_t close = rest.find(')');
    if (close != std::string::npos) {
      path = rest.substr(1, close - 1);
      rest = rest.substr(close + 1);
      if (absl::StartsWith(rest, ":")) rest = rest.substr(1);
      rest = std::string(absl::StripLeadingAsciiWhitespace(rest));
    }
  }
  // A repeated key of an `optional` scalar collides in its synthetic oneof "_<name>".
  const std::string kOneof = "oneof field '_";
  size_t oneof = rest.find(kOneof);
  if (oneof != std::string::npos && absl::StrContains(rest, "is already set")) {
    std::string field = rest.substr(oneof + kOneof.size());
    field = field.substr(0, field.find('\''));
    return absl::StrCat(origin, ": field \"", path.empty() ? field : absl::StrCat(path, ".", field),
                        "\" is given more than once");
  }
  const std::string kCannotFind = ": Cannot find field.";
  if (absl::EndsWith(rest, kCannotFind)) {
    std::string field = rest.substr(0, rest.size() - kCannotFind.size());
    const pb::Descriptor* d = DescriptorAt(path);
    return absl::StrCat(origin, JsonKeyPosition(text, {field}), ": unknown field \"",
                        path.empty() ? field : absl::StrCat(path, ".", field), "\"",
                        d ? absl::StrCat(" (known fields", path.empty() ? "" : " of " + path, ": ",
                                         KnownFields(d), ")")
                          : "",
                        "; remove it or fix its spelling");
  }
  if (!path.empty()) {
    // Map entries come as "strategy.options[0].value": report the map itself.
    std::string field_path = path.substr(0, path.find('['));
    std::string position;
    if (field_path == path) {
      size_t dot = path.rfind('.');
      std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
      std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
      position = JsonKeyPosition(text, NameAndJsonName(parent, leaf));
    }
    static const std::pair<const char*, const char*> kTypes[] = {
        {"for type TYPE_DOUBLE", "(expected a number)"},
        {"for type TYPE_FLOAT", "(expected a number)"},
        {"for type TYPE_INT32", "(expected a 32-bit integer)"},
        {"for type TYPE_INT64", "(expected an integer)"},
        {"for type TYPE_UINT64", "(expected a non-negative integer)"},
        {"for type TYPE_UINT32", "(expected a non-negative integer)"},
        {"for type TYPE_BOOL", "(expected true or false)"},
        {"for type TYPE_STRING", "(expected a string)"},
    };
    for (const auto& [from, to] : kTypes) {
      size_t p = rest.find(from);
      if (p != std::string::npos) rest.replace(p, std::string(from).size(), to);
    }
    return absl::StrCat(origin, position, ": field \"", field_path, "\": ", rest);
  }
  return absl::StrCat(origin, ": ", message);
}

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
bool IsUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int more = 0;  // continuation bytes
    uint32_t cp = c;
    if (c >= 0xC2 && c <= 0xDF) {
      more = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      more = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      more = 3, cp = c & 0x07;
    } else if (c >= 0x80) {
      return false;  // a continuation byte first, or a lead byte no valid sequence has
    }
    if (i + size_t(more) >= s.size() && more > 0) return false;  // cut short
    for (int k = 1; k <= more; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((more == 2 && cp < 0x800) || (more == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += size_t(more) + 1;
  }
  return true;
}

// Calls visit(field, path, index) on every value of `m`'s set fields, in ListFields' order: once
// for a singular field (index -1), once per element of a repeated one; `path` is the field's
// ("optimizer.params.lr" under prefix "optimizer.params"). Stops at the first non-empty answer
// and returns it.
template <typename Visit>
std::string ForEachSetValue(const pb::Message& m, const std::string& prefix, Visit visit) {
  const pb::Reflection* r = m.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      std::string answer = visit(f, path, f->is_repeated() ? i : -1);
      if (!answer.empty()) return answer;
    }
  }
  return "";
}

// The message value `index` of message field f (-1: the singular field).
const pb::Message& Element(const pb::Message& m, const pb::FieldDescriptor* f, int index) {
  const pb::Reflection* r = m.GetReflection();
  return index >= 0 ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f);
}

// What text format lets through that a config must not hold, or "" when there is none:
//  - string fields that are not UTF-8: its escapes ("\\261") can put any bytes in a string, JSON
//    cannot carry them, and no name or path Braid reads is meant to hold them;
//  - a map key given twice (strategy.options): the parser keeps both entries and the last one
//    wins, so one of two values the user wrote would be dropped without a word.
std::string ProblemInStrings(const pb::Message& m, const std::string& prefix) {
  std::map<const pb::FieldDescriptor*, std::set<std::string>> keys;  // a map field's keys so far
  return ForEachSetValue(m, prefix, [&](const pb::FieldDescriptor* f, const std::string& path,
                                        int index) -> std::string {
    const pb::Reflection* r = m.GetReflection();
    if (f->type() == pb::FieldDescriptor::TYPE_STRING) {
      std::string scratch;
      const std::string& v = index >= 0 ? r->GetRepeatedStringReference(m, f, index, &scratch)
                                        : r->GetStringReference(m, f, &scratch);
      if (!IsUtf8(v)) {
        return absl::StrCat("field ", path, " holds bytes that are not UTF-8 (an escape such as "
                            "\\261?); write names and paths as UTF-8 text");
      }
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      const pb::Message& sub = Element(m, f, index);
      std::string problem = ProblemInStrings(sub, path);
      if (!problem.empty()) return problem;
      if (f->is_map()) {
        std::string k;
        pb::TextFormat::PrintFieldValueToString(sub, f->message_type()->map_key(), -1, &k);
        if (!keys[f].insert(k).second) {
          return absl::StrCat(path, " has the key ", k, " twice; keep the one you mean");
        }
      }
    }
    return "";
  });
}

// Where each field of a text config is, from the parser's ParseInfoTree: "<origin>:<line>:
// <column>" (1-based, as the parser's errors give them) by its field path ("optimizer.params.lr"),
// the first where a path repeats (a repeated field, a map's entries: the path names the field).
void TextKeyPositions(const pb::Message& m, const pb::TextFormat::ParseInfoTree& tree,
                      const std::string& origin, const std::string& prefix,
                      pb::Map<std::string, std::string>* out) {
  ForEachSetValue(m, prefix, [&](const pb::FieldDescriptor* f, const std::string& path, int index) {
    const pb::TextFormat::ParseLocationRange at = tree.GetLocationRange(f, index);
    if (at.start.line >= 0 && out->find(path) == out->end()) {
      // Counted as the parser's own errors count (a tab to the next multiple of 8).
      (*out)[path] = absl::StrCat(origin, ":", at.start.line + 1, ":", at.start.column + 1);
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || f->is_map()) return std::string();
    if (const pb::TextFormat::ParseInfoTree* nested = tree.GetTreeForNested(f, index)) {
      TextKeyPositions(Element(m, f, index), *nested, origin, path, out);
    }
    return std::string();
  });
}

}  // namespace

namespace internal {
std::string KeyPosition(const std::string& text, const std::string& key) {
  return JsonKeyPosition(text, {key});
}

std::map<std::string, std::string> JsonKeyPositions(const std::string& text) {
  std::map<std::string, std::string> out;
  // The containers open at the scan point: for an object, the path of the key last read in it
  // ("" before its first key); an array holds no keys a path can name, and hides those below.
  struct Open {
    bool object;
    std::string prefix;  // the object's own path + "." ("" at the top)
    std::string key;     // the last key read in it
  };
  std::vector<Open> open;
  int line = 1;
  size_t line_start = 0;
  bool expect_key = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
      line_start = i + 1;
    } else if (ch == '{' || ch == '[') {
      std::string prefix;
      bool named = !open.empty() && open.back().object && !open.back().key.empty();
      if (open.empty()) named = true;
      if (!open.empty() && open.back().object) prefix = open.back().prefix + open.back().key + ".";
      open.push_back({ch == '{' && named, prefix, ""});
      expect_key = ch == '{';
    } else if (ch == '}' || ch == ']') {
      if (!open.empty()) open.pop_back();
      expect_key = false;
    } else if (ch == ',') {
      expect_key = !open.empty() && open.back().object;
    } else if (ch == '"') {
      const size_t begin = i;
      std::string s;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) ++i;
        s += text[i];
      }
      if (expect_key && !open.empty() && open.back().object) {
        open.back().key = s;
        out.emplace(open.back().prefix + s,
                    absl::StrCat(":", line, ":", begin - line_start + 1));
        expect_key = false;
      }
    }
  }
  return out;
}
}  // namespace internal

// -------------------------------------------------------------------------------------------------
// Public API

absl::StatusOr<TrainConfig> ParseTextConfig(const std::string& text, const std::string& origin,
                                            const ReadOptions& read) {
  TrainConfig cfg;
  pb::TextFormat::Parser parser;
  TextErrorCollector errors(text, origin);
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  pb::TextFormat::ParseInfoTree tree;
  if (read.defer_to_validation) parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &cfg)) {
    std::string message = errors.Errors();
    if (message.empty())
      message = absl::StrCat(origin, ": not a valid text-format training config");
    return absl::InvalidArgumentError(message);
  }
  if (std::string problem = ProblemInStrings(cfg, ""); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", problem));
  }
  // Validation then places its problems at the fields they name, as it does a JSON file's.
  if (read.defer_to_validation) TextKeyPositions(cfg, tree, origin, "", cfg.mutable_key_positions());
  return cfg;
}

absl::StatusOr<TrainConfig> ParseJsonConfig(const std::string& text, const std::string& origin,
                                            const ReadOptions& read) {
  TrainConfig cfg;
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  // "auto" values leave the JSON before it is read as a TrainConfig; positions in errors are
  // still looked up in the text as written.
  std::vector<std::string> auto_fields;
  std::string json = internal::StripAutoValues(text, &auto_fields);
  // Every unknown key at once (protobuf's reader would stop at the first), and DeepSpeed's
  // keys that have no field here.
  internal::JsonKeys keys;
  json = internal::CheckJsonKeys(text, json, origin, &keys);
  if (!keys.read) {
    // Not checked (a syntax error, a key given twice): that problem first, not an unknown key
    // that the check would have accepted.
    pb::util::JsonParseOptions lenient;
    lenient.ignore_unknown_fields = true;
    TrainConfig scratch;
    auto status = pb::util::JsonStringToMessage(json, &scratch, lenient);
    if (!status.ok()) {
      std::string message(status.message().data(), status.message().size());
      return absl::InvalidArgumentError(DescribeJsonError(text, origin, message));
    }
  }
  auto problems = [&](const std::vector<std::string>& all) {
    if (all.size() == 1) return absl::InvalidArgumentError(all[0]);
    return absl::InvalidArgumentError(
        absl::StrCat(all.size(), " problems in ", origin, ": ", absl::StrJoin(all, "; ")));
  };
  if (!keys.problems.empty() && !read.defer_to_validation) return problems(keys.problems);
  // The keys with problems are out of `json`: what protobuf still refuses ends the reading here,
  // with them.
  auto status = pb::util::JsonStringToMessage(json, &cfg, options);
  if (!status.ok()) {
    std::string message(status.message().data(), status.message().size());
    keys.problems.push_back(DescribeJsonError(text, origin, message));
    return problems(keys.problems);
  }
  if (read.defer_to_validation) {
    for (std::string& problem : keys.problems) cfg.add_reader_problems(std::move(problem));
    cfg.mutable_key_positions()->insert(keys.positions.begin(), keys.positions.end());
  }
  for (std::string& path : auto_fields) cfg.add_auto_fields(std::move(path));
  for (std::string& path : keys.ignored_fields) cfg.add_ignored_fields(std::move(path));
  return cfg;
}

absl::StatusOr<TrainConfig> LoadConfigFile(const std::string& path, const ReadOptions& read) {
  const std::string lower = absl::AsciiStrToLower(path);
  const bool json = absl::EndsWith(lower, ".json");
  const bool text = absl::EndsWith(lower, ".pbtxt") || absl::EndsWith(lower, ".textproto") ||
                    absl::EndsWith(lower, ".txt");
  if (!json && !text) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file ", Quoted(path),
        ": unknown extension; use .json for JSON or .pbtxt, .textproto or .txt for text format"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config file ", Quoted(path), " cannot be read"));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("config file ", Quoted(path), ": read error"));
  }
  return json ? ParseJsonConfig(contents.str(), path, read)
              : ParseTextConfig(contents.str(), path, read);
}

Sections SectionsOf(const TrainConfig& cfg) {
  Sections s;
  const pb::Reflection* from = cfg.GetReflection();
  const pb::Reflection* to = s.GetReflection();
  const pb::Descriptor* d = Sections::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    const pb::FieldDescriptor* t = TrainConfig::descriptor()->FindFieldByName(f->name());
    // The two .proto files agree on each section's name, number and type (sections.proto says
    // so; config_test checks it too): a mismatch is a broken build, not a user's mistake.
    BRAID_CHECK(t != nullptr && t->number() == f->number() && t->type() == f->type() &&
                t->message_type() == f->message_type() && !f->is_repeated())
        << "Sections." << f->name() << " is not TrainConfig's field of that name and number";
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (from->HasField(cfg, t)) to->MutableMessage(&s, f)->CopyFrom(from->GetMessage(cfg, t));
    } else {
      BRAID_CHECK(f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) << f->name() << ": a section or text";
      to->SetString(&s, f, from->GetString(cfg, t));
    }
  }
  return s;
}

std::string ConfigToText(const TrainConfig& cfg) {
  std::string out;
  pb::TextFormat::PrintToString(cfg, &out);
  return out;
}

std::string ConfigToJson(const TrainConfig& cfg) {
  std::string out;
  pb::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;  // DeepSpeed's snake_case names
  auto status = pb::util::MessageToJsonString(cfg, &out, options);
  BRAID_CHECK(status.ok()) << "printing a TrainConfig as JSON: " << status.ToString();
  return out;
}

}  // namespace braid::config
