// Registers the datasets the training program can load (core/registry.h), described by what
// they yield so that config validation can check the model and the data section against them,
// with their loaders (DatasetSpec::open): the training program opens each through the registry.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/config/sections.pb.h"
#include "core/registry.h"
#include "models/data/find_data.h"
#include "models/data/mnist_batches.h"
#include "models/data/token_batches.h"
#include "models/data/token_manifest.h"
#include "models/data/validation_batches.h"

namespace braid::data {
namespace {

// An eval section's batches from a prepared data set's validation split; a flat token file has
// none.
absl::StatusOr<std::vector<Batch>> TokenValidationBatches(const BatchSourceRequest& r) {
  const std::string& path = r.config->data().path();
  if (!IsTokenDatasetPath(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval needs a validation split: set data { dataset: \"tokens\" path: \"<folder>\" } to a "
        "data set prepared with bazel run //tools:prepare_data -- --val_fraction=0.1 ... (data.path "
        "is \"",
        path, "\", a flat token file)"));
  }
  BRAID_ASSIGN_OR_RETURN(TokenDataset set, TokenDataset::Open(path));
  BRAID_ASSIGN_OR_RETURN(std::shared_ptr<const TokenFile> tokens, set.Tokens(Split::kValidation));
  return ValidationBatches(*tokens, r.config->eval().batches(), r.batch, r.context, r.device);
}

const bool kRegistered = [] {
  Registry& r = Registry::Get();
  DatasetSpec moby;  // the novel's text, one token per byte (find_data.h: kMobyDickText)
  moby.yields = "tokens";
  moby.token_dtypes = {"u8"};
  moby.default_token_dtype = "u8";
  moby.vocab_size = 256;
  moby.is_default = true;  // the reference run (docs/REFERENCE_RUN.md)
  moby.open = [](const BatchSourceRequest& r) { return OpenTokenBatches(r, kMobyDickText); };
  moby.eval_refused =
      "eval needs a validation split, which the novel's bytes do not have: prepare the text with "
      "bazel run //tools:prepare_data -- --val_fraction=0.1 ... and train on data.dataset "
      "\"tokens\"";
  BRAID_CHECK_OK(r.AddDataset("moby-dick", moby, "models/data"));

  DatasetSpec mnist;  // 28x28 grey digits with their labels (mnist.h)
  mnist.yields = "labelled 28x28 images";
  mnist.unit = "samples";
  mnist.open = OpenMnistBatches;
  mnist.eval_refused =
      "eval is for language models (a validation split of token data); MNIST's test accuracy is "
      "reported after training without it: remove the eval section";
  BRAID_CHECK_OK(r.AddDataset("mnist", mnist, "models/data"));

  // A prepared data set, its folder or manifest.json (token_manifest.h: its ids and width are
  // the manifest's), or a flat binary file of token ids (token_data.h, data.token_dtype wide).
  DatasetSpec tokens;
  tokens.yields = "tokens";
  tokens.token_dtypes = {"u8", "u16", "u32"};
  tokens.default_token_dtype = "u16";
  tokens.path_needed =
      "a prepared data set's folder or manifest.json (bazel run //tools:prepare_data), or a flat "
      "token file";
  tokens.open = [](const BatchSourceRequest& r) { return OpenTokenBatches(r, ""); };
  tokens.validation = TokenValidationBatches;
  // A prepared data set's manifest says its largest id; a flat file is checked as it is read.
  tokens.check_vocab = [](const config::Sections& c, int64_t vocab_size) {
    return IsTokenDatasetPath(c.data().path()) ? CheckTokenDatasetVocab(c.data().path(), vocab_size)
                                               : absl::OkStatus();
  };
  BRAID_CHECK_OK(r.AddDataset("tokens", tokens, "models/data"));
  return true;
}();

}  // namespace
}  // namespace braid::data
