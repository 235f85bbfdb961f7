// bazel run //tools:prepare_data -- --tokenizer=gpt2|byte|gpt2:<dir>|sentencepiece:<model>
//     --out=FOLDER [--val_fraction=0.1] [--seed=1234] [--jsonl_field=text] [--threads=N]
//     [--shard_tokens=N] [--eot=auto|none|ID] INPUT...
//
// Tokenizes text files, folders of them and JSON-lines files into a prepared token data set
// (shards and manifest.json, models/data/token_manifest.h) that `data { dataset: "tokens"
// path: "FOLDER" }` trains on. A progress line (MB/s, ETA) on stderr; every error is one line on
// stderr and exit status 1 (2 for a usage error). docs/DATA.md says more.
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/cli/user_path.h"
#include "tools/prepare_data/prepare.h"
#include "tools/tokenize/make_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "gpt2",
          "byte, gpt2, gpt2:<folder holding encoder.json and vocab.bpe>, or "
          "sentencepiece:<file.model>");
ABSL_FLAG(std::string, out, "", "folder to write the shards and manifest.json to (required)");
ABSL_FLAG(double, val_fraction, 0.1,
          "fraction of the documents held out for validation, whole documents (0: none)");
ABSL_FLAG(uint64_t, seed, 1234, "seed of the train/validation shuffle of the documents");
ABSL_FLAG(std::string, jsonl_field, "text", "the field holding the text in JSON-lines inputs");
ABSL_FLAG(int, threads, 0, "tokenizing threads (0: one per core)");
ABSL_FLAG(int64_t, shard_tokens, 100'000'000, "most tokens in one shard file");
ABSL_FLAG(std::string, eot, "auto",
          "id written after each document: auto (GPT-2's <|endoftext|>, a SentencePiece model's "
          "</s>; none for byte), none, or a number");
ABSL_FLAG(int, crash_after_shards, -1,
          "for tests: stop as if killed once this many shards are written");
ABSL_FLAG(bool, quiet, false, "print only errors");

namespace {

using braid::tools::UserPath;

[[noreturn]] void Fail(const std::string& message, int status = 1) {
  std::fprintf(stderr, "prepare_data: %s\n", message.c_str());
  std::exit(status);
}

std::string Duration(double s) {
  const int64_t t = int64_t(s + 0.5);
  return t >= 3600 ? absl::StrFormat("%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60)
                   : absl::StrFormat("%d:%02d", t / 60, t % 60);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "prepare_data --tokenizer=gpt2|byte|gpt2:<dir>|sentencepiece:<model> --out=FOLDER "
      "[--val_fraction=0.1] [--seed=N] [--jsonl_field=text] [--threads=N] INPUT...\n"
      "INPUT: text files, folders (their .txt, .md, .text, .jsonl and .ndjson files) and "
      "JSON-lines files (.jsonl, .ndjson)");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  braid::tools::PrepareOptions o;
  o.inputs.assign(args.begin() + 1, args.end());
  o.out_dir = absl::GetFlag(FLAGS_out);
  if (o.out_dir.empty()) Fail("--out=FOLDER is required (where the shards and manifest.json go)", 2);
  if (o.inputs.empty()) Fail("no input: name text files, folders or JSON-lines files", 2);

  // Tokenizer files named relative to the user's folder; then work from that folder, so that
  // the inputs and messages keep the paths as typed.
  std::string spec = absl::GetFlag(FLAGS_tokenizer);
  for (const char* prefix : {"gpt2:", "sentencepiece:"}) {
    if (absl::StartsWith(spec, prefix) && spec.size() > strlen(prefix)) {
      spec = absl::StrCat(prefix, UserPath(spec.substr(strlen(prefix))));
    }
  }
  auto tokenizer = braid::tools::MakeTokenizer(spec);
  if (!tokenizer.ok()) Fail(std::string(tokenizer.status().message()));
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (wd != nullptr && *wd != '\0' && chdir(wd) != 0) Fail(absl::StrCat("cannot enter ", wd));

  const std::string eot = absl::GetFlag(FLAGS_eot);
  if (eot == "auto") {
    o.eot_id = braid::tools::DefaultEndOfText(**tokenizer);
  } else if (eot != "none") {
    uint32_t id;
    if (!absl::SimpleAtoi(eot, &id)) Fail(absl::StrCat("--eot=", eot, ": give auto, none or an id"), 2);
    o.eot_id = id;
  }
  o.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.jsonl_field = absl::GetFlag(FLAGS_jsonl_field);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads <= 0) o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  o.shard_tokens = absl::GetFlag(FLAGS_shard_tokens);
  o.crash_after_shards = absl::GetFlag(FLAGS_crash_after_shards);

  const bool quiet = absl::GetFlag(FLAGS_quiet);
  const bool tty = isatty(fileno(stderr));
  double last_line = -1;
  auto progress = [&](const braid::tools::PrepareProgress& p) {
    // On a terminal, one line redrawn; in a log, a line every 10 s.
    if (quiet || (!tty && p.seconds - last_line < 10 && p.bytes_done < p.bytes_total)) return;
    last_line = p.seconds;
    const double mb = p.bytes_done / 1e6, rate = p.seconds > 0 ? mb / p.seconds : 0;
    const double left = rate > 0 ? (p.bytes_total - p.bytes_done) / 1e6 / rate : 0;
    std::fprintf(stderr, "%sprepare_data: %5.1f%% of %.1f MB, %.1f MB/s, ETA %s%s",
                 tty ? "\r" : "", 100.0 * p.bytes_done / std::max<int64_t>(1, p.bytes_total),
                 p.bytes_total / 1e6, rate, Duration(left).c_str(), tty ? "\x1b[K" : "\n");
  };
  auto m = braid::tools::PrepareData(**tokenizer, o, progress);
  if (tty && !quiet) std::fprintf(stderr, "\n");
  if (!m.ok()) Fail(std::string(m.status().message()));
  if (!quiet) {
    using braid::data::Split;
    std::fprintf(stderr,
                 "prepare_data: wrote %s: %lld train tokens (%lld documents, %zu shard(s)), %lld "
                 "validation tokens (%lld documents); tokenizer %s, %u ids, %s%s\n",
                 o.out_dir.c_str(), (long long)m->Tokens(Split::kTrain), (long long)m->train_documents,
                 m->Shards(Split::kTrain).size(), (long long)m->Tokens(Split::kValidation),
                 (long long)m->validation_documents, m->tokenizer.c_str(), m->vocab_size,
                 braid::data::TokenTypeName(m->dtype),
                 m->eot_id ? absl::StrCat(", end of text ", *m->eot_id).c_str() : ", no end-of-text id");
  }
  return 0;
}
