// The pipeline strategy's options and the cut of a model's layers into stages: what the
// strategy decides before it runs anything, apart from the executor (pipeline.cc) that runs it.
#ifndef BRAID_PLUGINS_PIPELINE_PARTITION_H_
#define BRAID_PLUGINS_PIPELINE_PARTITION_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::pipeline {

struct Options {
  int stages = 0;
  std::string schedule = "1f1b";
  int chunks = 1;                          // virtual stages per rank (interleaved)
  std::string partition = "parameters";    // "parameters", "time", "uniform", or counts "2,3,1"
  // Chrome trace of the last step, one file per rank ("{rank}" is replaced): pid = replica,
  // tid = stage, so the files of one replica opened together show one row per stage.
  std::string trace_file;
  // Receives posted this many forwards/backwards ahead of the schedule (pipeline.cc says why);
  // -1: the stage count, which suffices for every shipped schedule. 0 posts them in place.
  int receives_ahead = -1;
  // Each backward split in its input's and its weights' gradients (SplitBackward).
  bool split_backward = false;
};

// Whether `key` is one of the pipeline's options (the others of a stack's options belong to the
// layer it wraps).
bool IsPipelineOption(const std::string& key);

// The strategy's options (TrainConfig's strategy.options); errors name the option and what to set.
// `mesh_stages`: the mesh's pipeline size (>= 1), the stage count; the option "stages" may
// repeat it but not contradict it.
absl::StatusOr<Options> ParseOptions(const std::map<std::string, std::string>& options,
                                     int mesh_stages);

// Contiguous ranges [begin, end) of layers for each of `parts` pieces: "uniform" (equal layer
// counts), "parameters" (minimises the largest piece's summed `cost`, whatever the unit: the
// caller passes parameter counts or measured times), or explicit counts such as "2,3,1".
absl::StatusOr<std::vector<std::pair<int, int>>> Partition(const std::vector<int64_t>& cost,
                                                           int parts, const std::string& how);

}  // namespace braid::pipeline

#endif  // BRAID_PLUGINS_PIPELINE_PARTITION_H_
