// libFuzzer target for the training config's readers: the text-format and JSON parsers and the
// validation behind them, i.e. whatever a user's --config file (or a DeepSpeed JSON) holds.
// Registered model and dataset doubles (config_test_util) let validation run its model hooks.
//
// Beyond "no crash": whatever parses must print back (as text and as JSON) to a config that
// parses to the same message, and validation must end in OK or an error with a message, for
// any data-parallel size. Replayed by //launcher/config:config_fuzzer_corpus_test; fuzzed by
// tools/fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launcher/config/config.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"

namespace {

using braid::config::TrainConfig;

void Fail(const char* what, const TrainConfig& a, const TrainConfig& b) {
  std::fprintf(stderr, "config_fuzzer: %s\n--- first:\n%s\n--- second:\n%s\n", what,
               a.DebugString().c_str(), b.DebugString().c_str());
  std::abort();
}

// Equal as messages; NaN equals NaN (text prints "nan" and reads back a NaN, perhaps another).
bool Same(const TrainConfig& a, const TrainConfig& b) {
  google::protobuf::util::DefaultFieldComparator floats;
  floats.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer diff;
  diff.set_field_comparator(&floats);
  return diff.Compare(a, b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the reader and the job's size; the rest is the file.
  const uint8_t how = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool json = how & 1;
  const int data_parallel = 1 + ((how >> 1) & 7);
  {
    // The training program's way: the reader's problems kept for validation, which must then
    // refuse (with a message) whatever the reader alone would have, and leave neither the
    // problems nor the positions behind (a text file's too: its reader records positions).
    braid::config::ReadOptions defer;
    defer.defer_to_validation = true;
    auto deferred = json ? braid::config::ParseJsonConfig(text, "fuzz.json", defer)
                         : braid::config::ParseTextConfig(text, "fuzz.pbtxt", defer);
    if (!deferred.ok() && deferred.status().message().empty()) std::abort();
    if (deferred.ok()) {
      const bool reader_refused = deferred->reader_problems_size() > 0;
      absl::Status st = braid::config::ValidateConfig(&*deferred, data_parallel,
                                                      {"fp16", "bf16", "zero1", "zero2", "zero3"});
      if (reader_refused && st.ok()) std::abort();
      if (!st.ok() && st.message().empty()) std::abort();
      if (deferred->reader_problems_size() > 0 || deferred->key_positions_size() > 0) std::abort();
    }
  }
  auto cfg = json ? braid::config::ParseJsonConfig(text, "fuzz.json")
                  : braid::config::ParseTextConfig(text, "fuzz.pbtxt");
  if (!cfg.ok()) {
    if (cfg.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  auto again = braid::config::ParseTextConfig(braid::config::ConfigToText(*cfg), "again.pbtxt");
  if (!again.ok() || !Same(*cfg, *again)) Fail("text round trip differs", *cfg, again.ok() ? *again : TrainConfig());
  auto from_json = braid::config::ParseJsonConfig(braid::config::ConfigToJson(*cfg), "again.json");
  if (!from_json.ok() || !Same(*cfg, *from_json)) {
    Fail("JSON round trip differs", *cfg, from_json.ok() ? *from_json : TrainConfig());
  }
  TrainConfig validated = *cfg;
  absl::Status st = braid::config::ValidateConfig(&validated, data_parallel,
                                                  {"fp16", "bf16", "zero1", "zero2", "zero3"});
  if (!st.ok() && st.message().empty()) std::abort();
  return 0;
}
