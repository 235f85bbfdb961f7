// Linked into a test, makes the reference kernels serve every CPU slot no backend filled. The
// registration waits for the test environment's SetUp, after every static initialiser ran, so a
// backend linked into the same test keeps its own kernels.
#include "core/testing/reference_kernels.h"
#include "gtest/gtest.h"

namespace braid::reference {
namespace {

class ReferenceKernelsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { RegisterReferenceKernels(); }
};

::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new ReferenceKernelsEnvironment);

}  // namespace
}  // namespace braid::reference
