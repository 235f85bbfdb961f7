// Where and why a text is not JSON, for the messages of readers of outside JSON files
// (checkpoint indexes, data manifests). nlohmann's DOM parser without exceptions says only that
// a text is not JSON; this second pass, run only then, finds the place and the reason, still
// without exceptions (a SAX handler that stops at the first error).
//
// Header-only on purpose: readers that must not link core (the checkpoint index, which its
// fuzzer links alone) include it through //core:headers.
#ifndef BRAID_CORE_JSON_SYNTAX_ERROR_H_
#define BRAID_CORE_JSON_SYNTAX_ERROR_H_

#include <cstddef>
#include <string>

#include "nlohmann/json.hpp"

namespace braid {

namespace json_syntax_internal {

class ErrorFinder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) override {
    what_ = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, ...": the tag means nothing to a
    // user.
    const std::size_t tag = what_.find("] ");
    if (what_.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) what_.erase(0, tag + 2);
    return false;
  }
  const std::string& what() const { return what_; }

 private:
  std::string what_ = "a syntax error";
};

}  // namespace json_syntax_internal

// For a text nlohmann::json::parse refused: "parse error at line L, column C: ...".
inline std::string JsonSyntaxError(const std::string& text) {
  json_syntax_internal::ErrorFinder finder;
  nlohmann::json::sax_parse(text, &finder);
  return finder.what();
}

}  // namespace braid

#endif  // BRAID_CORE_JSON_SYNTAX_ERROR_H_
