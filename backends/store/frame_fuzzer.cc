// libFuzzer target for the store's wire parser (frame.h): the code that reads whatever a stranger
// sends to the rendezvous port. A braid_fuzzer (core/testing/fuzz.bzl): tools/fuzz/run.sh fuzzes
// it, and //backends/store:frame_fuzzer_corpus_test replays the kept inputs
// (fuzz_corpus/frame_fuzzer/).
//
// Beyond "no crash, no out-of-bounds read", it checks that parsing is exact: whatever parses must
// encode back to the very same bytes (the format has no slack), so a parser that accepted
// something the encoder would never produce -- or lost a field -- stops the run.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/store/frame.h"

namespace {

namespace wire = braid::store_wire;

void Fail(const char* what) {
  std::fprintf(stderr, "frame_fuzzer: %s\n", what);
  std::abort();
}

// The body of an encoded frame (the encoders return header + body).
absl::string_view BodyOf(const std::string& frame) {
  return absl::string_view(frame).substr(wire::kFrameHeaderBytes);
}

void CheckBody(absl::string_view body) {
  if (auto m = wire::ParseHello(body); m.ok()) {
    if (BodyOf(wire::EncodeHello(*m)) != body) Fail("Hello does not re-encode to its input");
  }
  if (auto m = wire::ParseAuth(body); m.ok()) {
    if (BodyOf(wire::EncodeAuth(*m)) != body) Fail("Auth does not re-encode to its input");
  }
  if (auto m = wire::ParseAuthResult(body); m.ok()) {
    if (BodyOf(wire::EncodeAuthResult(*m)) != body) Fail("AuthResult does not re-encode");
  }
  if (auto m = wire::ParseRequest(body); m.ok()) {
    if (!wire::ValidateRequest(*m).ok()) Fail("a parsed request fails validation");
    std::string again = wire::EncodeRequest(*m);
    if (BodyOf(again) != body) Fail("Request does not re-encode to its input");
    auto split = wire::SplitFrame(again, wire::kMaxFrameBytes);
    if (!split.ok() || !split->complete || split->consumed != again.size()) {
      Fail("an encoded request does not split as one frame");
    }
    auto back = wire::ParseRequest(split->body);
    if (!back.ok() || !(*back == *m)) Fail("Request round trip differs");
  }
  if (auto m = wire::ParseResponse(body); m.ok()) {
    if (BodyOf(wire::EncodeResponse(*m)) != body) Fail("Response does not re-encode");
  }
}

// The input as a byte stream, cut into frames the way a connection's reader would.
void CheckStream(absl::string_view stream, size_t max_body) {
  while (!stream.empty()) {
    auto split = wire::SplitFrame(stream, max_body);
    if (!split.ok() || !split->complete) return;
    if (split->consumed == 0 || split->consumed > stream.size()) Fail("bad split size");
    if (split->body.size() > max_body) Fail("split body over the limit");
    CheckBody(split->body);
    stream.remove_prefix(split->consumed);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  CheckBody(in);
  CheckStream(in, wire::kMaxHandshakeFrameBytes);
  CheckStream(in, wire::kMaxFrameBytes);
  return 0;
}
