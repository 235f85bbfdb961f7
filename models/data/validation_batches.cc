#include "models/data/validation_batches.h"

#include "absl/strings/str_cat.h"

namespace braid::data {

absl::StatusOr<std::vector<Batch>> ValidationBatches(const TokenFile& tokens, int64_t count,
                                                     int64_t batch, int64_t context, Device device) {
  if (count < 1 || batch < 1 || context < 1) {
    return absl::InvalidArgumentError(absl::StrCat("validation batches: count (", count, "), batch (",
                                                   batch, ") and context (", context, ") must be >= 1"));
  }
  if (tokens.size() <= context) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokens.path(), ": the validation split holds ", tokens.size(), " tokens, not more than the context of ",
        context, "; prepare the data with a larger --val_fraction"));
  }
  const int64_t windows = count * batch;
  const int64_t last_start = tokens.size() - context - 1;  // the last window whose target fits
  std::vector<Batch> out;
  std::vector<int32_t> row(size_t(context + 1));
  for (int64_t k = 0; k < count; ++k) {
    std::vector<int32_t> x(size_t(batch * context)), y(size_t(batch * context));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t w = k * batch + b;
      // Integer arithmetic: the same starts on every machine.
      const int64_t start = windows == 1 ? 0 : w * last_start / (windows - 1);
      tokens.Copy(start, context + 1, row.data());
      std::copy(row.begin(), row.end() - 1, x.begin() + b * context);
      std::copy(row.begin() + 1, row.end(), y.begin() + b * context);
    }
    out.push_back(Batch{Tensor::FromVector(x, {batch, context}, device),
                        Tensor::FromVector(y, {batch, context}, device)});
  }
  return out;
}

}  // namespace braid::data
