// The ops for a process without torch's Python: a C ABI (model/torchless.py, model/torchless_model.py).
// A one-off `specedit rewrite` runs its model through these before, or without, importing torch, whose
// import is most of a cold start's time.
// Each function wraps its caller's buffers as tensors, without a copy, and calls the op of the same name, so
// its outputs are that op's, bit for bit. Each returns null, or what went wrong (valid until the calling
// thread's next call).
#include "kernels.h"

// A linear layer's packed weights as model/quantized.py keeps them: q (panels, blocks, 64) uint8, scales
// and offsets (panels, groups, 16) float16, bias (panels * 16) float32 or null, and its width in bits.
struct PackedLinear {
  const uint8_t* q;
  int64_t panels, blocks;
  const void* scales;
  const void* offsets;
  int64_t groups;
  const float* bias;
  int64_t bits;
};

namespace {

thread_local std::string last_error;

template <typename Body>
const char* reporting(const Body& body) {
  try {
    c10::InferenceMode inference;  // (no autograd records for what the buffers go through)
    body();
    return nullptr;
  } catch (const std::exception& error) {
    last_error = error.what();
    return last_error.c_str();
  }
}

at::Tensor floats(const float* data, at::IntArrayRef shape) {
  return at::from_blob(const_cast<float*>(data), shape, at::kFloat);
}

struct Packed {
  std::vector<at::Tensor> q, scales, offsets;
  c10::List<c10::optional<at::Tensor>> biases;
  std::vector<int64_t> bits;

  Packed(const PackedLinear* layers, size_t count) {
    for (const PackedLinear* l = layers; l < layers + count; ++l) {
      q.push_back(at::from_blob(const_cast<uint8_t*>(l->q), {l->panels, l->blocks, kQuadBytes}, at::kByte));
      scales.push_back(at::from_blob(const_cast<void*>(l->scales), {l->panels, l->groups, kPanel}, at::kHalf));
      offsets.push_back(at::from_blob(const_cast<void*>(l->offsets), {l->panels, l->groups, kPanel}, at::kHalf));
      biases.push_back(l->bias ? c10::optional<at::Tensor>(floats(l->bias, {l->panels * kPanel})) : c10::nullopt);
      bits.push_back(l->bits);
    }
  }
};

void copy_out(const at::Tensor& result, float* out) {
  const at::Tensor whole = result.contiguous();
  std::memcpy(out, whole.data_ptr<float>(), whole.numel() * sizeof(float));
}

}  // namespace

extern "C" {

void specedit_set_threads(int64_t threads) { at::set_num_threads(static_cast<int>(threads)); }

int64_t specedit_threads() { return at::get_num_threads(); }

// rms_norm of x (M, K) into out (M, K).
const char* specedit_rms_norm(const float* x, int64_t M, int64_t K, const float* weight, double eps, float* out) {
  return reporting([&] { copy_out(rms_norm(floats(x, {M, K}), floats(weight, {K}), eps), out); });
}

// One linear layer on x (M, K) into out (M, panels * 16): q8_linear, q5_linear or q4_linear by its bits.
const char* specedit_linear(const float* x, int64_t M, int64_t K, const PackedLinear* layer, float* out) {
  return reporting([&] {
    const Packed p(layer, 1);
    copy_out(int_linears("specedit_linear", floats(x, {M, K}), p.q, p.scales, p.offsets, p.biases, p.bits)[0], out);
  });
}

// decoder_layer on x (T, hidden) into out (T, hidden), its seven linear layers in decoder_layer's order;
// the cache's keys and values each (H_kv, capacity, D), float16 where `half` else float32, of which the first
// `positions` (at least first + T) are the view decoder_layer is given.
const char* specedit_decoder_layer(const float* x, int64_t T, int64_t hidden, const float* input_norm,
                                   const float* post_norm, double eps, const PackedLinear* linears,
                                   const float* cos, const float* sin, int64_t D, void* keys, void* values,
                                   int64_t half, int64_t positions, int64_t capacity, int64_t first, double scale,
                                   int64_t heads, int64_t kv_heads, float* out) {
  return reporting([&] {
    const Packed p(linears, 7);
    const auto cached = [&](void* data) {
      return at::from_blob(data, {1, kv_heads, positions, D}, {kv_heads * capacity * D, capacity * D, D, 1},
                           half ? at::kHalf : at::kFloat);
    };
    copy_out(decoder_layer(floats(x, {1, T, hidden}), floats(input_norm, {hidden}), floats(post_norm, {hidden}), eps,
                           p.q, p.scales, p.offsets, p.biases, p.bits, floats(cos, {T, D}), floats(sin, {T, D}),
                           cached(keys), cached(values), first, scale, heads, kv_heads),
             out);
  });
}

}  // extern "C"
