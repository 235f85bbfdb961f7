// Interleaved comparison of a checkpoint file's save and load, one pass (shard_io.h) against the
// two-pass way it replaced (safetensors.h's writer then a CRC-32 pass over the data in
// memory; a full read to check the CRC, then a second full read to load). Relative figures on a
// busy machine: each round runs both, alternating which goes first.
//   bazel build //plugins/checkpoint:shard_io_bench && bazel-bin/plugins/checkpoint/shard_io_bench [MiB] [rounds] [dir]
// Loads read from the page cache (the file was just written); saves include the fsync.
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "plugins/checkpoint/safetensors.h"
#include "plugins/checkpoint/shard_io.h"

namespace braid::checkpoint {
namespace {

uint32_t DataCrc(const std::map<std::string, Tensor>& tensors) {  // the old second pass
  uLong crc = crc32(0L, Z_NULL, 0);
  for (auto& [key, t] : tensors) {
    const Bytef* p = static_cast<const Bytef*>(t.raw_data());
    for (size_t left = t.nbytes(); left > 0;) {
      const uInt n = uInt(std::min<size_t>(left, size_t(1) << 30));
      crc = crc32(crc, p, n);
      p += n;
      left -= n;
    }
  }
  return uint32_t(crc);
}

double Seconds(absl::Time t0) { return absl::ToDoubleSeconds(absl::Now() - t0); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 512;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string dir = argc > 3 ? argv[3] : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  std::map<std::string, Tensor> tensors;
  std::mt19937 rng(1);
  for (int i = 0; i < 8; ++i) {  // 8 tensors of random floats
    Tensor t = Tensor::Empty({mib * (1 << 20) / 8 / 4});
    float* p = t.data<float>();
    for (int64_t j = 0; j < t.numel(); ++j) p[j] = float(rng()) / 4294967296.0f;
    tensors["t" + std::to_string(i)] = t;
  }
  const double gb = double(mib) * (1 << 20) / 1e9;
  const std::string path_old = dir + "/shard_io_bench_old.safetensors";
  const std::string path_new = dir + "/shard_io_bench_new.safetensors";
  std::vector<double> save_old, save_new, load_old, load_new;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool old_way = (k == 0) == (r % 2 == 0);
      absl::Time t0 = absl::Now();
      if (old_way) {
        if (!SaveSafetensors(path_old, tensors, {{"format", "x"}}).ok()) return 1;
        volatile uint32_t c = DataCrc(tensors);
        (void)c;
        save_old.push_back(Seconds(t0));
        t0 = absl::Now();
        auto verify = ReadSafetensors(path_old);
        volatile uint32_t c2 = DataCrc(verify->tensors);
        (void)c2;
        verify = absl::InternalError("");  // freed before the load, as the old Latest did
        auto load = ReadSafetensors(path_old);
        if (!load.ok()) return 1;
        load_old.push_back(Seconds(t0));
      } else {
        auto w = WriteShard(path_new, tensors, {{"format", "x"}});
        if (!w.ok()) return 1;
        save_new.push_back(Seconds(t0));
        t0 = absl::Now();
        auto load = ReadShard(path_new, w->bytes, w->crc32);
        if (!load.ok()) return 1;
        load_new.push_back(Seconds(t0));
      }
    }
    std::printf("{\"round\": %d, \"save_s_old\": %.3f, \"save_s_new\": %.3f, \"load_s_old\": %.3f, \"load_s_new\": %.3f}\n",
                r, save_old.back(), save_new.back(), load_old.back(), load_new.back());
    std::fflush(stdout);
  }
  std::remove(path_old.c_str());
  std::remove(path_new.c_str());
  std::printf("%lld MiB, %d rounds, medians: save %.3f s (%.2f GB/s) two-pass vs %.3f s (%.2f GB/s) one-pass; "
              "load %.3f s (%.2f GB/s) vs %.3f s (%.2f GB/s)\n",
              (long long)mib, rounds, Median(save_old), gb / Median(save_old), Median(save_new),
              gb / Median(save_new), Median(load_old), gb / Median(load_old), Median(load_new),
              gb / Median(load_new));
  return 0;
}

}  // namespace
}  // namespace braid::checkpoint

int main(int argc, char** argv) { return braid::checkpoint::Main(argc, argv); }
