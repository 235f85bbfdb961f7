// Braid's tokenizer on one file, one thread: MB/s of Encode. One timing per process; the driver
// (tokenizer_bench.py) alternates this with tiktoken's (tiktoken_bench.js) and takes medians.
//   bazel run //tools/bench:tokenizer_bench -- --tokenizer=gpt2 --reps=5 FILE
// Prints one JSON line: {"impl": "braid", "bytes": .., "tokens": .., "mb_per_s": [..],
// "mb_per_cpu_s": [..]} (per timed encode: by wall time, by the process's CPU time).
#include <time.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "tools/tokenize/make_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "gpt2", "byte, gpt2 or gpt2:<dir>");
ABSL_FLAG(int, reps, 5, "timed encodes of the whole file, after one untimed warm-up");

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: tokenizer_bench [--tokenizer=gpt2] [--reps=5] FILE\n";
    return 2;
  }
  std::ifstream in(args[1], std::ios::binary);
  if (!in) {
    std::cerr << "tokenizer_bench: cannot read " << args[1] << "\n";
    return 1;
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  auto tok = braid::tools::MakeTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::cerr << "tokenizer_bench: " << tok.status().message() << "\n";
    return 1;
  }
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  (*tok)->Encode(text, &ids);  // warm-up: caches, page faults
  const size_t tokens = ids.size();
  // Wall time, and the process's CPU time: on a shared machine the second leaves out the time
  // the scheduler gave to others.
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  std::vector<double> mbs, cpu_mbs;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    ids.clear();
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_now();
    (*tok)->Encode(text, &ids);
    double c = cpu_now() - c0;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mbs.push_back(text.size() / 1e6 / s);
    cpu_mbs.push_back(text.size() / 1e6 / c);
  }
  std::printf(
      "{\"impl\": \"braid\", \"bytes\": %zu, \"tokens\": %zu, \"mb_per_s\": [%s], "
      "\"mb_per_cpu_s\": [%s]}\n",
      text.size(), tokens, absl::StrJoin(mbs, ", ").c_str(), absl::StrJoin(cpu_mbs, ", ").c_str());
  return ids.size() == tokens ? 0 : 1;
}
