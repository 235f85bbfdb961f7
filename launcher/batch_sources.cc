#include "launcher/batch_sources.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/registry.h"
#include "launcher/config/config.h"

namespace braid::launcher {

absl::StatusOr<std::unique_ptr<BatchSource>> BuildData(const config::TrainConfig& cfg, Module&,
                                                       int dp_rank, int dp_size, Device device) {
  BRAID_ASSIGN_OR_RETURN(DatasetSpec dataset, Registry::Get().GetDataset(cfg.data().dataset()));
  if (!dataset.open) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.dataset '", cfg.data().dataset(),
        "' is registered without a loader (DatasetSpec::open): the training program cannot read it"));
  }
  // The model's context, as its registration says (ModelSpec::context); 1 for a model of samples.
  absl::StatusOr<ModelSpec> model = Registry::Get().GetModel(cfg.model().name());
  const config::Sections sections = config::SectionsOf(cfg);  // read while opening, not kept
  BatchSourceRequest request;
  request.config = &sections;
  request.batch = cfg.train_micro_batch_size_per_gpu();
  request.context = model.ok() && model->context ? model->context(cfg.model()) : 1;
  request.dp_rank = dp_rank;
  request.dp_size = dp_size;
  request.device = device;
  return dataset.open(request);
}

}  // namespace braid::launcher
