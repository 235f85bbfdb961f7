// One head of causal attention on the CPU (f32), shared by the fused attention of a q|k|v
// projection (attention.cc, GPT) and grouped-query attention (gqa_attention.cc, Llama): the same
// register-blocked products (6 query rows x 16 columns of FMA accumulators) over whatever row
// strides the caller's layout has. The caller lays out the operands each product wants contiguous
// (Kᵀ, Vᵀ, and rows copied out of a wide stride, see CopyRows), so that a K/V head shared by a
// group of query heads is prepared once for the group.
#ifndef BRAID_BACKENDS_CPU_ATTENTION_HEAD_H_
#define BRAID_BACKENDS_CPU_ATTENTION_HEAD_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace braid::cpu::attention {

// Forward: att [T, T] (rows T apart) gets the causal softmax of scale * q kᵀ, zero above the
// diagonal; out[t] = sum_u att[t, u] v[u]. q's rows lie ldq floats apart, out's ldo; kt is Kᵀ
// [D, T] and vc is V [T, D], both contiguous.
void HeadForward(int64_t T, int64_t D, float scale, const float* q, int64_t ldq, const float* kt,
                 const float* vc, float* att, float* out, int64_t ldo);

// Backward of HeadForward given dout: qc, kc and gc (dout) are [T, D] contiguous, vt is Vᵀ
// [D, T], att the forward's probabilities; ds is [T, T] scratch. Writes (overwrites) dq's rows,
// ldq apart, and dk's and dv's, ldkv apart.
void HeadBackward(int64_t T, int64_t D, float scale, const float* qc, const float* kc,
                  const float* vt, const float* gc, const float* att, float* ds, float* dq,
                  int64_t ldq, float* dk, float* dv, int64_t ldkv);

// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols.
void Transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst);

// rows x cols of a strided matrix into a contiguous one. The products read their right-hand
// side row by row; rows of q/k/v lie whole-width apart (3 KiB at gpt-mini's), a stride that maps
// every row onto the same few L1 sets, so a contiguous copy keeps the operand in L1.
void CopyRows(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst);

// Grows a per-thread buffer to n floats; kernels keep no heap traffic after the first step.
inline float* Scratch(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(std::size_t(n));
  return v.data();
}

}  // namespace braid::cpu::attention

#endif  // BRAID_BACKENDS_CPU_ATTENTION_HEAD_H_
