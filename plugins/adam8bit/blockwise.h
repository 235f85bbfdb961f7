// Blockwise 8-bit quantization with a dynamic (tree) map, after Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization" (ICLR 2022). Plain C++ over float arrays, with no Braid
// state, so that the plugin and its tests both link it (a plugin may only depend on
// self-contained libraries: docs/WRITING_A_STRATEGY.md §4).
//
// A tensor of n values is cut into blocks of kBlockSize consecutive values (the last one may be
// shorter). Each block keeps one f32 absmax; each value is stored as the index (one byte) of the
// code of the map nearest to value / absmax. Dequantizing is map[index] * absmax.
#ifndef BRAID_PLUGINS_ADAM8BIT_BLOCKWISE_H_
#define BRAID_PLUGINS_ADAM8BIT_BLOCKWISE_H_

#include <array>
#include <cstdint>

namespace braid::adam8bit {

// Values per block, as bitsandbytes' blockwise optimizers (it has used 2048 and 256). Smaller
// blocks isolate outliers better but cost more absmax bytes (4 / kBlockSize per value and state):
// at 2048 that is 0.002 B per value, which keeps Adam8bit at ~2.0 B of state per parameter.
inline constexpr int64_t kBlockSize = 2048;

// Tensors with fewer values keep 32-bit states (bitsandbytes' min_8bit_size): they are biases and
// norms, a small share of the bytes, and the ones most sensitive to quantization noise.
inline constexpr int64_t kMin8bitSize = 4096;

inline constexpr int kCodes = 256;

// A quantization map: 256 codes sorted ascending, and the 255 decision points between neighbours
// (the midpoints), which the nearest-code search bisects.
struct QuantMap {
  std::array<float, kCodes> code;
  // mid[i] = (code[i] + code[i+1]) / 2 for i < 255; mid[255] = +inf (never compared).
  std::array<float, kCodes> mid;
  bool is_signed;
};

// The dynamic tree maps, built once (thread-safe statics). A code is read from its bits as
//   [sign] 0...0 1 f...f : E zero bits (the decimal exponent), a 1 marking its end, and the
//   remaining F bits a linear fraction, value = ±10^-E * (0.1 + 0.9 * k / 2^F), k = 1..2^F;
// the all-zero pattern is 0. Signed (for Adam's first moment): one sign bit, E = 0..6, so F =
// 6 - E: 64 + 32 + ... + 1 = 127 magnitudes per sign in [1e-6, 1], plus +0 and -0 (two codes of
// value 0, one per sign; sorted next to each other). Unsigned (for the second moment, which is
// never negative): no sign bit, E = 0..7, F = 7 - E: 255 values in [1e-7, 1] plus 0.
// The fraction takes the right end of each of the 2^F intervals of [0.1, 1] (bitsandbytes takes
// midpoints and adds 1.0 by hand): every decade then ends on an exact 10^-E, so ±1 are codes and
// a block's largest value is stored exactly.
const QuantMap& SignedMap();
const QuantMap& UnsignedMap();

// The index of the code nearest to x (ties go to the lower code): a branch-free binary search over
// the 255 midpoints, eight comparisons. x should be in [-1, 1] (values outside land on the end
// codes); NaN lands on code 0 (its block's absmax is NaN then, see QuantizeBlock).
inline uint8_t NearestCode(const QuantMap& map, float x) {
  int i = 0;
  for (int step = kCodes / 2; step > 0; step >>= 1) {
    if (x > map.mid[i + step - 1]) i += step;
  }
  return uint8_t(i);
}

// Quantizes one block of n <= kBlockSize values: writes n codes and returns the block's absmax.
// A NaN in the block makes the absmax NaN, so that the whole block dequantizes to NaN and a
// diverged update stays visible, as it would with f32 states (instead of turning into a code).
// On CPUs with AVX2 the search runs 8 values at a time (blockwise.cc); the codes are those of
// QuantizeBlockScalar, value for value (blockwise_test.cc checks it).
float QuantizeBlock(const QuantMap& map, const float* x, int64_t n, uint8_t* codes);
// The same with NearestCode one value at a time: the reference.
float QuantizeBlockScalar(const QuantMap& map, const float* x, int64_t n, uint8_t* codes);
// out[i] = map.code[codes[i]] * absmax for n values.
void DequantizeBlock(const QuantMap& map, const uint8_t* codes, float absmax, int64_t n,
                     float* out);

// Whole arrays: ceil(n / kBlockSize) blocks, absmax[b] for block b.
int64_t NumBlocks(int64_t n);
void Quantize(const QuantMap& map, const float* x, int64_t n, uint8_t* codes, float* absmax);
void Dequantize(const QuantMap& map, const uint8_t* codes, const float* absmax, int64_t n,
                float* out);

}  // namespace braid::adam8bit

#endif  // BRAID_PLUGINS_ADAM8BIT_BLOCKWISE_H_
