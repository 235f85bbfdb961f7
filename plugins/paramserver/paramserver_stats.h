// What the "paramserver" strategy reports beyond core/strategy.h: its versions and the staleness
// it observed, so that tests (and curious users) can check the staleness bound from counters
// rather than from timing.
//
// The strategy object made by Registry::Get().MakeStrategy("paramserver") also implements
// ParamServerIntrospection:
//   auto* ps = dynamic_cast<braid::paramserver::ParamServerIntrospection*>(strategy.get());
// Header-only on purpose: the class lives in libbraid_paramserver.so and callers never link it.
#ifndef BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_STATS_H_
#define BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_STATS_H_

#include <cstdint>

namespace braid::paramserver {

struct ParamServerStats {
  bool is_server = false;
  int64_t steps = 0;  // TrainStep calls completed
  // Server: optimizer updates applied so far (the parameters' version). Worker: the version of
  // the parameters it holds now.
  int64_t version = 0;

  // ---- Workers ----
  // The largest number of this worker's own pushes still unanswered when it started computing
  // a gradient: how many steps it ran ahead of the parameters it held. Never above the option
  // max_staleness (0 in sync mode).
  int max_steps_ahead = 0;
  // Steps at which the worker had to wait for fresh parameters because it was too far ahead.
  int64_t waits_for_fresh = 0;

  // ---- Server ----
  int64_t gradients_applied = 0;
  // The largest (version when a gradient was applied) - (version it was computed on): how many
  // updates a gradient missed. 0 in sync mode; in async mode at most
  // (max_staleness + 2) * workers - 2 (docs/WRITING_A_STRATEGY.md derives it).
  int64_t max_version_lag = 0;
};

class ParamServerIntrospection {
 public:
  virtual ~ParamServerIntrospection() = default;
  // Call between steps, from the thread that runs them.
  virtual ParamServerStats Stats() const = 0;
};

}  // namespace braid::paramserver

#endif  // BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_STATS_H_
