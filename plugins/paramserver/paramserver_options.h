// The options of the "paramserver" strategy (mode, server_rank, max_staleness) and their parser.
// Internal to the plugin; paramserver.cc parses them first thing in Setup.
#ifndef BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_OPTIONS_H_
#define BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_OPTIONS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace braid::paramserver {

enum class Mode { kSync = 0, kAsync = 1 };

struct Options {
  Mode mode = Mode::kSync;
  int server_rank = 0;
  // Async only: how many of its pushes a worker may leave unanswered and still compute the
  // next gradient. Each unit costs a worker one more copy of the gradients and parameters.
  int max_staleness = 0;
};

constexpr int kDefaultMaxStaleness = 2;
constexpr int kMaxStalenessLimit = 64;

// Parsed before any communication: every rank gets the same options, so a bad one fails every
// rank the same way, at once, instead of leaving the others waiting in a collective.
absl::StatusOr<Options> ParseOptions(const std::map<std::string, std::string>& in);

const char* ModeName(Mode m);

}  // namespace braid::paramserver

#endif  // BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_OPTIONS_H_
