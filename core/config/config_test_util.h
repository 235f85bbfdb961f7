// What config's two test files share (config_test.cc: parsing and files; config_validate_test.cc:
// validation): the model and dataset doubles validation runs against, registered by linking this
// testonly library (a static initializer, hence alwayslink), and Text, a config parsed or the
// test failed.
#ifndef BRAID_CORE_CONFIG_CONFIG_TEST_UTIL_H_
#define BRAID_CORE_CONFIG_CONFIG_TEST_UTIL_H_

#include <string>

#include "core/config/train_config.pb.h"

namespace braid::config::test_util {

// `text` parsed as a text-format config; on failure the test fails and the config is empty.
TrainConfig Text(const std::string& text);

}  // namespace braid::config::test_util

#endif  // BRAID_CORE_CONFIG_CONFIG_TEST_UTIL_H_
