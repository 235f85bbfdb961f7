// Writes the ddp strategy's timeline as a Chrome trace (chrome://tracing, Perfetto): the JSON
// object format with "traceEvents" of complete ("X") events, pid = rank, tid = lane.
#ifndef BRAID_PLUGINS_DDP_CHROME_TRACE_H_
#define BRAID_PLUGINS_DDP_CHROME_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "plugins/ddp/ddp_trace.h"

namespace braid::ddp {

// The trace of one rank. Comm-lane events are shown back to back (a reduction is drawn from
// when the previous one finished or its own launch, whichever is later, since viewers want the
// events of one track not to overlap); the true launch and ready times are kept in "args".
std::string ChromeTraceJson(const std::vector<TraceEvent>& events, int rank);

// Writes `contents` to `path` through a temporary file in the same folder and a rename, so a
// reader never sees a half-written trace.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace braid::ddp

#endif  // BRAID_PLUGINS_DDP_CHROME_TRACE_H_
