// Writes a seed corpus for frame_fuzzer: one file per valid message (as a bare body and as a
// framed stream), so that fuzzing starts from inputs that reach deep into every parser.
// Usage: frame_fuzz_seeds <directory>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backends/store/frame.h"

namespace wire = braid::store_wire;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  std::vector<std::string> frames;
  wire::Hello hello;
  hello.nonce.fill(7);
  frames.push_back(wire::EncodeHello(hello));
  wire::Auth auth;
  auth.nonce.fill(1);
  auth.mac.fill(2);
  frames.push_back(wire::EncodeAuth(auth));
  wire::AuthResult ok;
  ok.ok = true;
  ok.mac.fill(3);
  frames.push_back(wire::EncodeAuthResult(ok));
  wire::AuthResult fail;
  fail.reason = "job token rejected";
  frames.push_back(wire::EncodeAuthResult(fail));
  auto request = [&](wire::MessageType op, std::vector<std::string> keys) {
    wire::Request r;
    r.op = op;
    r.keys = std::move(keys);
    return r;
  };
  wire::Request set = request(wire::MessageType::kSet, {"rank/0/addr"});
  set.value = "127.0.0.1:4000";
  frames.push_back(wire::EncodeRequest(set));
  wire::Request get = request(wire::MessageType::kGet, {"rank/1/addr"});
  get.timeout_ms = 1000;
  frames.push_back(wire::EncodeRequest(get));
  wire::Request wait = request(wire::MessageType::kWait, {"a", "bb", "ccc"});
  wait.timeout_ms = 5;
  frames.push_back(wire::EncodeRequest(wait));
  wire::Request add = request(wire::MessageType::kAdd, {"barrier/0"});
  add.delta = -3;
  frames.push_back(wire::EncodeRequest(add));
  wire::Request cas = request(wire::MessageType::kCompareSet, {"leader"});
  cas.expected = "";
  cas.value = "rank 2";
  frames.push_back(wire::EncodeRequest(cas));
  frames.push_back(wire::EncodeRequest(request(wire::MessageType::kDelete, {"k"})));
  wire::Response resp;
  resp.code = absl::StatusCode::kDeadlineExceeded;
  resp.number = 42;
  resp.text = "waited 1s for key 'x'";
  frames.push_back(wire::EncodeResponse(resp));

  std::string dir = argv[1];
  std::string all;
  for (size_t i = 0; i < frames.size(); ++i) {
    std::ofstream(dir + "/framed_" + std::to_string(i), std::ios::binary) << frames[i];
    std::ofstream(dir + "/body_" + std::to_string(i), std::ios::binary)
        << frames[i].substr(wire::kFrameHeaderBytes);
    all += frames[i];
  }
  std::ofstream(dir + "/stream_all", std::ios::binary) << all;
  return 0;
}
