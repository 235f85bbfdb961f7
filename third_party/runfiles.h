// Bazel's C++ runfiles library (finds data files of a binary or test at run time).
#ifndef BRAID_THIRD_PARTY_RUNFILES_H_
#define BRAID_THIRD_PARTY_RUNFILES_H_

#include "tools/cpp/runfiles/runfiles.h"

#endif  // BRAID_THIRD_PARTY_RUNFILES_H_
