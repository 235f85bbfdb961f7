// The main() of a fuzz target in the ordinary build: it runs LLVMFuzzerTestOneInput over the
// files it is given (each file, or every file under each folder), so that `bazel test` replays a
// target's kept corpus with g++ in seconds, and so that a crash the fuzzer found can be rerun
// under a debugger by hand. Fuzzing itself is tools/fuzz/run.sh (clang, libFuzzer, ASan, UBSan),
// which links libFuzzer's main instead of this one.
//
// It fails when it ran no input at all: a replay of an empty or misplaced corpus proves nothing.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunOne(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz replay: cannot read %s\n", path.c_str());
    return -1;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A copy of exactly `size` bytes, as libFuzzer passes: reading one past it is a bug the
  // sanitizers of a fuzzing build would report.
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(arg);
    }
    for (const auto& f : files) {
      const int r = RunOne(f);
      if (r < 0) return 1;
      ran += r;
    }
  }
  if (ran == 0) {
    std::fprintf(stderr, "fuzz replay: no input to run (give corpus files or folders)\n");
    return 1;
  }
  std::printf("fuzz replay: %d input(s) ran without a crash\n", ran);
  return 0;
}
