// bazel run //tools:tokenize -- --tokenizer=gpt2|byte|gpt2:<dir>|sentencepiece:<model>
//                                [--ids_out=FILE.u32] FILE...
// bazel run //tools:tokenize -- --tokenizer=gpt2 --decode FILE.u32...
//
// Encodes each FILE (any bytes) and prints its ids, one line per file, or writes them all to
// --ids_out as little-endian u32, so Braid's ids can be compared with any other tokenizer's.
// --decode reads such u32 files and writes their text to stdout. Every error is one line on
// stderr and exit status 1 (2 for a usage error).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/cli/user_path.h"
#include "tools/tokenize/make_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "gpt2",
          "byte, gpt2, gpt2:<folder holding encoder.json and vocab.bpe>, or "
          "sentencepiece:<file.model>");
ABSL_FLAG(std::string, ids_out, "",
          "write the ids of all FILEs, one after another, here as little-endian u32 "
          "(default: print them, one line per file)");
ABSL_FLAG(bool, decode, false, "read u32 id files and print their text");

namespace {

using braid::tools::UserPath;

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "tokenize: " << message << "\n";
  std::exit(1);
}

std::string ReadOrFail(const std::string& path) {
  std::ifstream in(UserPath(path), std::ios::binary);
  if (!in) Fail(absl::StrCat(path, ": cannot read it"));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// Written beside the target and renamed over it, so an interrupted run leaves no partial file
// under the name a later step reads.
void WriteIds(const std::string& path, const std::vector<uint32_t>& ids) {
  const std::string target = UserPath(path);
  const std::string tmp = target + ".partial";
  std::vector<unsigned char> bytes(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < 4; ++k) bytes[4 * i + k] = static_cast<unsigned char>(ids[i] >> (8 * k));
  }
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) Fail(absl::StrCat(path, ": cannot write it"));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), target.c_str()) != 0) {
    std::remove(tmp.c_str());
    Fail(absl::StrCat(path, ": writing it failed (disk full?)"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tokenize --tokenizer=gpt2|byte|gpt2:<dir>|sentencepiece:<model> [--ids_out=FILE.u32] "
      "[--decode] FILE...");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> files(args.begin() + 1, args.end());
  if (files.empty()) {
    std::cerr << "tokenize: no FILE given; usage: " << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  // A file named in the spec is the user's path too.
  std::string spec = absl::GetFlag(FLAGS_tokenizer);
  for (const char* prefix : {"gpt2:", "sentencepiece:"}) {
    if (absl::StartsWith(spec, prefix) && spec.size() > strlen(prefix)) {
      spec = prefix + UserPath(spec.substr(strlen(prefix)));
    }
  }
  auto tokenizer = braid::tools::MakeTokenizer(spec);
  if (!tokenizer.ok()) Fail(std::string(tokenizer.status().message()));
  const braid::text::Tokenizer& tok = **tokenizer;

  if (absl::GetFlag(FLAGS_decode)) {
    for (const std::string& file : files) {
      std::string raw = ReadOrFail(file);
      if (raw.size() % 4 != 0) {
        Fail(absl::StrCat(file, ": ", raw.size(),
                          " bytes is not a whole number of u32 ids (4 bytes each); --decode "
                          "reads what --ids_out writes"));
      }
      std::vector<uint32_t> ids(raw.size() / 4);
      const auto* b = reinterpret_cast<const unsigned char*>(raw.data());
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = uint32_t{b[4 * i]} | uint32_t{b[4 * i + 1]} << 8 | uint32_t{b[4 * i + 2]} << 16 |
                 uint32_t{b[4 * i + 3]} << 24;
      }
      auto text = tok.Decode(ids);
      if (!text.ok()) {
        Fail(absl::StrCat(file, ": ", text.status().message(), "; were these ids written with "
                          "another tokenizer than --tokenizer=", absl::GetFlag(FLAGS_tokenizer),
                          "?"));
      }
      std::cout << *text;
    }
    std::cout.flush();
    return std::cout ? 0 : 1;
  }

  const std::string ids_out = absl::GetFlag(FLAGS_ids_out);
  std::vector<uint32_t> all;
  size_t bytes = 0;
  for (const std::string& file : files) {
    std::string text = ReadOrFail(file);
    bytes += text.size();
    if (!ids_out.empty()) {
      tok.Encode(text, &all);
    } else {
      std::cout << absl::StrJoin(tok.Encode(text), " ") << "\n";
    }
  }
  if (!ids_out.empty()) {
    WriteIds(ids_out, all);
    std::cerr << "tokenize: " << bytes << " bytes -> " << all.size() << " " << tok.name()
              << " tokens (vocabulary " << tok.vocab_size() << ") in " << ids_out << "\n";
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}
