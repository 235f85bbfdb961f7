// What config's two test files share (config_test.cc: parsing and files; config_validate_test.cc:
// validation): the model and dataset doubles validation runs against, registered by linking this
// testonly library (a static initializer, hence alwayslink), and Text, a config parsed or the
// test failed.
#ifndef BRAID_LAUNCHER_CONFIG_CONFIG_TEST_UTIL_H_
#define BRAID_LAUNCHER_CONFIG_CONFIG_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

#include "launcher/config/train_config.pb.h"

namespace braid::config::test_util {

// `text` parsed as a text-format config; on failure the test fails and the config is empty.
TrainConfig Text(const std::string& text);

// A double of the training program's composer (launcher/compose.h, tested there): the layer that
// holds the training state, i.e. the named strategy, or for a config that names none (or names
// the pipeline, which serves only its own axis) "ddp" for several data-parallel ranks and
// "single" for one.
std::string ComposeDouble(int tensor, int pipeline, int data, const std::string& named);

// ValidateConfigWith the composer double: `features` are the chosen strategy's; the strategies
// that provide a missing one are those registered so far.
absl::Status Validate(TrainConfig* cfg, int dp, const std::vector<std::string>& features);

// The message of Validate on `text`, "" if it passes.
std::string ValidationError(const std::string& text, int dp = 1,
                            const std::vector<std::string>& features = {});

}  // namespace braid::config::test_util

#endif  // BRAID_LAUNCHER_CONFIG_CONFIG_TEST_UTIL_H_
