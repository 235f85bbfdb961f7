#include "plugins/ddp/chrome_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid::ddp {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string ChromeTraceJson(const std::vector<TraceEvent>& events, int rank) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  absl::StrAppendFormat(&out,
                        "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                        "\"args\": {\"name\": \"rank %d\"}},\n",
                        rank, rank);
  absl::StrAppendFormat(&out,
                        "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                        "\"args\": {\"name\": \"compute\"}},\n",
                        rank);
  absl::StrAppendFormat(&out,
                        "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, "
                        "\"args\": {\"name\": \"comm\"}}",
                        rank);
  double comm_free_us = 0;  // when the comm track's previous event ends
  for (const TraceEvent& e : events) {
    double start = e.start_us, end = std::max(e.end_us, e.start_us);
    std::string args = absl::StrFormat("\"step\": %d", e.step);
    if (e.micro_batch >= 0) absl::StrAppendFormat(&args, ", \"micro_batch\": %d", e.micro_batch);
    if (e.lane == Lane::kComm) {
      start = std::min(std::max(start, comm_free_us), end);
      comm_free_us = end;
      absl::StrAppendFormat(&args,
                            ", \"bucket\": %d, \"bytes\": %d, \"ready_us\": %.3f, "
                            "\"launch_us\": %.3f, \"done_us\": %.3f",
                            e.bucket, e.bytes, e.ready_us, e.start_us, e.end_us);
    }
    absl::StrAppendFormat(&out,
                          ",\n{\"name\": %s, \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                          "\"dur\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {%s}}",
                          JsonString(e.name), e.lane == Lane::kComm ? "comm" : "compute", start,
                          end - start, rank, int(e.lane), args);
  }
  out += "\n]}\n";
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write trace file '", tmp, "': ", std::strerror(errno)));
  }
  bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write trace file '", path, "': ", why));
  }
  return absl::OkStatus();
}

}  // namespace braid::ddp
