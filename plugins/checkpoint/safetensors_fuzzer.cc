// libFuzzer target for the safetensors reader (safetensors.h): the 8-byte header length, the
// JSON header and the byte ranges, as a downloaded weights file or a checkpoint shard holds
// them. The input is the whole file, handed to ReadSafetensors through an in-memory file.
//
// Beyond "no crash": a file that reads must survive a round trip: laid out again by
// LayOutSafetensors (the writer's own layout) and read back, it gives the same names, dtypes,
// shapes, bytes and metadata. Replayed by //plugins/checkpoint:safetensors_fuzzer_corpus_test;
// fuzzed by tools/fuzz/run.sh.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "plugins/checkpoint/safetensors.h"

namespace {

void Fail(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzzer: %s\n", what.c_str());
  std::abort();
}

// An anonymous in-memory file holding `parts`, named by a path any open() accepts.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("safetensors_fuzz", 0)) {
    if (fd_ < 0) Fail("memfd_create failed");
  }
  ~MemFile() { close(fd_); }
  void Append(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = write(fd_, p, n);
      if (w <= 0) Fail("write to the in-memory file failed");
      p += w;
      n -= size_t(w);
    }
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

bool SameBytes(const braid::Tensor& a, const braid::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemFile file;
  file.Append(data, size);
  auto got = braid::ReadSafetensors(file.path());
  if (!got.ok()) {
    if (got.status().message().empty()) Fail("a refusal without a message");
    return 0;
  }
  auto layout = braid::LayOutSafetensors(got->tensors, got->metadata);
  if (!layout.ok()) Fail("a file that reads cannot be written again: " + layout.status().ToString());
  MemFile again;
  again.Append(layout->prefix.data(), layout->prefix.size());
  for (const braid::Tensor& t : layout->data) again.Append(t.raw_data(), t.nbytes());
  auto back = braid::ReadSafetensors(again.path());
  if (!back.ok()) Fail("the rewritten file does not read: " + back.status().ToString());
  if (back->metadata != got->metadata) Fail("metadata differs after the round trip");
  if (back->tensors.size() != got->tensors.size()) Fail("tensor count differs after the round trip");
  for (const auto& [name, t] : got->tensors) {
    auto it = back->tensors.find(name);
    if (it == back->tensors.end() || !SameBytes(t, it->second)) Fail("tensor " + name + " differs");
  }
  return 0;
}
