// Writes the inputs, outputs and gradients of the Llama-family ops, run on the CPU backend, as
// raw little-endian f32 files into the folder argv[1], for llama_ops_torch_test.py to recompute
// with PyTorch. Inputs come from a fixed seed; each backward starts from a fixed random
// projection of the output (saved too), so the script needs nothing else.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/ops.h"

namespace braid {
namespace {

std::string g_dir;
std::mt19937 g_rng(2024);

void Save(const std::string& name, const Tensor& t) {
  std::vector<float> v = t.ToFloatVector();
  const std::string path = g_dir + "/" + name + ".f32";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  BRAID_CHECK(f != nullptr) << "cannot write " << path;
  BRAID_CHECK(std::fwrite(v.data(), sizeof(float), v.size(), f) == v.size()) << path;
  std::fclose(f);
}

Tensor Leaf(const std::string& name, const Shape& shape, float lo, float hi) {
  Tensor t = Tensor::Empty(shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(g_rng);
  Save(name, t);
  t.set_requires_grad(true);
  return t;
}

// Backward from a random projection R of `out` (saved as <name>.r), then saves out and every
// input's gradient as <name>.out, <name>.grad<i>.
void Finish(const std::string& name, const Tensor& out, const std::vector<Tensor>& inputs) {
  Tensor r = Leaf(name + ".r", out.shape(), -1.0f, 1.0f).Detach();
  Save(name + ".out", out);
  out.Backward(r);
  for (size_t i = 0; i < inputs.size(); ++i) Save(name + ".grad" + std::to_string(i), inputs[i].grad());
}

void Run() {
  {
    Tensor x = Leaf("rmsnorm.x", {3, 5, 64}, -2.0f, 2.0f), w = Leaf("rmsnorm.w", {64}, 0.5f, 1.5f);
    Finish("rmsnorm", ops::RmsNorm(x, w, 1e-5f), {x, w});
  }
  {
    Tensor g = Leaf("swiglu.gate", {4, 96}, -6.0f, 6.0f), u = Leaf("swiglu.up", {4, 96}, -2.0f, 2.0f);
    Finish("swiglu", ops::SwiGlu(g, u), {g, u});
  }
  {
    Tensor x = Leaf("rope.x", {2, 9, 3, 32}, -1.0f, 1.0f);
    Finish("rope", ops::RotaryEmbedding(x, {500000.0f, 2.0f, 4000}), {x});
  }
  {
    Tensor q = Leaf("gqa.q", {2, 7, 6, 16}, -1.0f, 1.0f);
    Tensor k = Leaf("gqa.k", {2, 7, 2, 16}, -1.0f, 1.0f);
    Tensor v = Leaf("gqa.v", {2, 7, 2, 16}, -1.0f, 1.0f);
    Finish("gqa", ops::GroupedQueryAttention(q, k, v), {q, k, v});
  }
}

}  // namespace
}  // namespace braid

int main(int argc, char** argv) {
  BRAID_CHECK(argc == 2) << "usage: llama_ops_dump <output folder>";
  braid::g_dir = argv[1];
  braid::Run();
  return 0;
}
