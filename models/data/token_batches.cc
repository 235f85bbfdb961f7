#include "models/data/token_batches.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/config/sections.pb.h"
#include "models/data/find_data.h"
#include "models/data/token_data.h"
#include "models/data/token_manifest.h"

namespace braid::data {
namespace {

class RandomWindows : public BatchSource {
 public:
  explicit RandomWindows(RandomWindowSampler s) : s_(std::move(s)) {}
  Batch Next() override { return s_.Next(); }
  int64_t TokensPerBatch() const override { return s_.batch() * s_.context(); }

 private:
  RandomWindowSampler s_;
};

class Sequential : public BatchSource {
 public:
  Sequential(SequentialLoader s, int64_t tokens) : s_(std::move(s)), tokens_(tokens) {}
  Batch Next() override { return s_.Next(); }
  int64_t TokensPerBatch() const override { return tokens_; }

 private:
  SequentialLoader s_;
  int64_t tokens_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenTokenBatches(const BatchSourceRequest& request,
                                                              const std::string& standard) {
  BRAID_CHECK(request.config != nullptr);
  const config::Sections& cfg = *request.config;
  const auto& d = cfg.data();
  std::string path = d.path();
  if (path.empty() && !standard.empty()) {
    BRAID_ASSIGN_OR_RETURN(path, FindDataFile(standard));
  }
  if (standard.empty() && access(path.c_str(), F_OK) != 0) {
    // Most often the preparation step was skipped or wrote elsewhere.
    return absl::NotFoundError(absl::StrCat(
        "data.path '", path, "' does not exist: prepare the data first (bazel run "
        "//tools:prepare_data -- --tokenizer=gpt2 --out=<folder> <your text>, docs/DATA.md) and "
        "give data.path that folder"));
  }
  std::shared_ptr<const TokenFile> shared;
  if (standard.empty() && IsTokenDatasetPath(path)) {
    // A prepared data set (//tools:prepare_data): every shard checked, and every id checked
    // against the model's vocabulary, here at start rather than as an abort mid-run.
    BRAID_ASSIGN_OR_RETURN(TokenDataset set, TokenDataset::Open(path));
    if (cfg.model().vocab_size() > 0) {
      BRAID_RETURN_IF_ERROR(set.CheckVocab(cfg.model().vocab_size()));
    }
    BRAID_ASSIGN_OR_RETURN(shared, set.Tokens(Split::kTrain));
  } else {
    const TokenType tt = d.token_dtype() == "u32"   ? TokenType::kU32
                         : d.token_dtype() == "u16" ? TokenType::kU16
                                                    : TokenType::kU8;
    BRAID_ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path, tt));
    shared = std::make_shared<const TokenFile>(std::move(file));
  }
  const int64_t batch = request.batch, t = request.context;
  if (d.sampler() == "sequential") {
    BRAID_ASSIGN_OR_RETURN(auto s, SequentialLoader::Create(shared, batch, t, request.dp_rank,
                                                            request.dp_size, request.device));
    return std::unique_ptr<BatchSource>(std::make_unique<Sequential>(std::move(s), batch * t));
  }
  BRAID_ASSIGN_OR_RETURN(auto s, RandomWindowSampler::Create(shared, batch, t, d.seed(),
                                                             request.dp_rank, request.device));
  return std::unique_ptr<BatchSource>(std::make_unique<RandomWindows>(std::move(s)));
}

}  // namespace braid::data
