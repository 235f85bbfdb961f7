// The pipelined ring reduce-scatter over Gloo's unbound buffers.
#include "backends/gloo/ring.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

namespace braid::gloo_backend::internal {

using ::gloo::transport::UnboundBuffer;

void RingReduceScatter(::gloo::Context& ctx, const char* in, char* out,
                       const std::vector<int64_t>& counts, size_t elem, ReduceFn fn, uint64_t slot,
                       std::chrono::milliseconds timeout, size_t segment_bytes, Scratch& scratch) {
  const int n = ctx.size, r = ctx.rank;
  std::vector<size_t> offset(n + 1, 0);  // in bytes
  size_t max_block = 0;
  for (int q = 0; q < n; ++q) {
    offset[q + 1] = offset[q] + size_t(counts[q]) * elem;
    max_block = std::max(max_block, size_t(counts[q]) * elem);
  }
  auto bytes_of = [&](int q) { return offset[q + 1] - offset[q]; };
  if (n == 1) {
    std::memcpy(out, in + offset[r], bytes_of(r));
    return;
  }
  if (max_block == 0) return;
  const size_t seg = std::max(elem, segment_bytes / elem * elem);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  const int right = mod(r + 1), left = mod(r - 1);

  char* base = scratch.Get<char>(4 * max_block);
  char* recv_mem[2] = {base, base + max_block};
  char* acc_mem[2] = {base + 2 * max_block, base + 3 * max_block};
  std::unique_ptr<UnboundBuffer> in_buf = ctx.createUnboundBuffer(const_cast<char*>(in), offset[n]);
  std::unique_ptr<UnboundBuffer> recv_buf[2], acc_buf[2];
  for (int i = 0; i < 2; ++i) {
    recv_buf[i] = ctx.createUnboundBuffer(recv_mem[i], max_block);
    acc_buf[i] = ctx.createUnboundBuffer(acc_mem[i], max_block);
  }

  auto post_recvs = [&](int s) {
    size_t bytes = bytes_of(mod(r - s - 2));
    for (size_t o = 0; o < bytes; o += seg) {
      recv_buf[s % 2]->recv(left, slot, o, std::min(seg, bytes - o));
    }
  };

  // Step 0 sends come straight from the input.
  int in_sends = 0;
  {
    int b = mod(r - 1);
    size_t bytes = bytes_of(b);
    for (size_t o = 0; o < bytes; o += seg, ++in_sends) {
      in_buf->send(right, slot, offset[b] + o, std::min(seg, bytes - o));
    }
  }
  post_recvs(0);
  int acc_sends[2] = {0, 0};
  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    if (!last) post_recvs(s + 1);
    char* dst = last ? out : acc_mem[s % 2];
    if (!last) {
      // acc[s % 2] still feeds the sends posted two steps ago.
      for (; acc_sends[s % 2] > 0; --acc_sends[s % 2]) acc_buf[s % 2]->waitSend(timeout);
    }
    const int b = mod(r - s - 2);
    const size_t bytes = bytes_of(b);
    const char* mine = in + offset[b];
    for (size_t o = 0; o < bytes; o += seg) {
      size_t len = std::min(seg, bytes - o);
      recv_buf[s % 2]->waitRecv(timeout);
      fn(dst + o, mine + o, recv_mem[s % 2] + o, len / elem);
      if (!last) {
        acc_buf[s % 2]->send(right, slot, o, len);
        ++acc_sends[s % 2];
      }
    }
  }
  for (; in_sends > 0; --in_sends) in_buf->waitSend(timeout);
  for (int i = 0; i < 2; ++i) {
    for (; acc_sends[i] > 0; --acc_sends[i]) acc_buf[i]->waitSend(timeout);
  }
}

}  // namespace braid::gloo_backend::internal
