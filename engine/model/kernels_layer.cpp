// A decoder layer's ops besides the linear layers and attention: its elementwise glue, and the whole layer in
// one call (model/decoder.py).
// - specedit::rms_norm, specedit::rotary, specedit::silu_mul: one call each where torch takes 6-8 operators
//   (and as many Python calls); each output depends on its own row alone, computed the same way on every
//   vector width;
// - specedit::decoder_layer: model/decoder.py's Layer on these kernels without the Python between its ops,
//   this forward's keys and values written into the cache's buffers on the way.
#include "kernels.h"

namespace {

// ---- a layer's elementwise glue: RMSNorm, rotary embeddings, SiLU times up ----

// RMSNorm of each row of x (M, K): weight * (x * (1 / sqrt(mean(x^2) + eps))), each multiplication rounded
// on its own as torch's are; the sum of squares in double (each square exact there), in 8 running sums
// by the input's index mod 8, added in a fixed order at the end.
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  TORCH_CHECK(input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm: float32");
  const int64_t K = input.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == K, "rms_norm: a weight per feature");
  const at::Tensor x = input.contiguous(), w = weight.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t M = K ? x.numel() / K : 0;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  at::parallel_for(0, M, 4, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float* row = xp + r * K;
      double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= K; i += 8)
        for (int j = 0; j < 8; ++j) partial[j] += static_cast<double>(row[i + j]) * row[i + j];
      for (int j = 0; i < K; ++i, ++j) partial[j] += static_cast<double>(row[i]) * row[i];
      const double total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                           ((partial[4] + partial[5]) + (partial[6] + partial[7]));
      const float mean = static_cast<float>(total / static_cast<double>(K));
      const float inverse = 1.0f / std::sqrt(mean + epsilon);
      for (int64_t k = 0; k < K; ++k) op[r * K + k] = wp[k] * (row[k] * inverse);
    }
  });
  return out;
}

// Rotary position embeddings of a projection's rows, as transformers applies them: states (T, H * D), row t
// at the position whose cos and sin are row t of (T, D) tables (each half of a row the same angles) ->
// (H, T, D), x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[D/2:], x[:D/2]): each product and the
// sum rounded on their own, so these are torch's bits.
at::Tensor rotary(const at::Tensor& states, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  TORCH_CHECK(states.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat, "rotary: float32");
  TORCH_CHECK(cos.dim() == 2 && sin.sizes() == cos.sizes(), "rotary: (T, D) cos and sin");
  const int64_t T = cos.size(0), D = cos.size(1), half = D / 2;
  TORCH_CHECK(D % 2 == 0 && heads > 0 && states.numel() == T * heads * D, "rotary: states of (T, heads * D)");
  const at::Tensor x = states.reshape({T, heads * D}).contiguous(), c = cos.contiguous(), s = sin.contiguous();
  at::Tensor out = at::empty({heads, T, D}, states.options());
  const float* xp = x.data_ptr<float>();
  const float *cp = c.data_ptr<float>(), *sp = s.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < T; ++t) {
      const float* in = xp + t * heads * D + h * D;
      const float *ct = cp + t * D, *st = sp + t * D;
      float* o = op + (h * T + t) * D;
      for (int64_t d = 0; d < half; ++d) o[d] = in[d] * ct[d] + (-in[d + half]) * st[d];
      for (int64_t d = half; d < D; ++d) o[d] = in[d] * ct[d] + in[d - half] * st[d];
    }
  return out;
}

// SiLU(g) * u of a vector: g / (1 + e^-g) for g >= 0, g e^g / (1 + e^g) below, both from e = e^-|g|.
inline Vec silu_times(Vec g, Vec u) {
  const Vec e = exp_nonpositive(subtract(zero(), magnitude(g)));
  const Vec one_plus = add(splat(1.0f), e);
  const Vec silu = kept_if_at_most(zero(), g, divide(g, one_plus), divide(mul(g, e), one_plus));
  return mul(silu, u);
}

// SiLU(gate) * up elementwise (the MLP's activation), the same operations on every vector width (a tail
// shorter than a vector goes through one, padded).
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.scalar_type() == at::kFloat && up.scalar_type() == at::kFloat && gate.sizes() == up.sizes(),
              "silu_mul: float32 gate and up of one shape");
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty_like(g);
  const int64_t n = g.numel();
  const float *gp = g.data_ptr<float>(), *up_ = u.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n / kLanes, 2048, [&](int64_t first, int64_t last) {
    for (int64_t v = first; v < last; ++v)
      store(op + v * kLanes, silu_times(load(gp + v * kLanes), load(up_ + v * kLanes)));
  });
  const int64_t done = n / kLanes * kLanes;
  if (done < n) {
    float gt[kLanes] = {}, ut[kLanes] = {}, ot[kLanes];
    std::copy(gp + done, gp + n, gt);
    std::copy(up_ + done, up_ + n, ut);
    store(ot, silu_times(load(gt), load(ut)));
    std::copy(ot, ot + (n - done), op + done);
  }
  return out;
}

// ---- a decoder layer in one call ----
// model/decoder.py's Layer on these kernels, its Python glue gone: RMSNorm, q, k and v in one call, both
// rotations, this forward's keys and values written into the cache, attention, o, the residual sum,
// RMSNorm, gate and up in one call, SiLU times up, down, the residual sum. Each step is the op a call of its
// own runs, on the same inputs in the same order, so the layer's output is the Python layer's, bit for bit.

// Biases [from, from + count) of a layer's seven.
c10::List<c10::optional<at::Tensor>> some_of(const c10::List<c10::optional<at::Tensor>>& all, size_t from,
                                             size_t count) {
  c10::List<c10::optional<at::Tensor>> part;
  for (size_t i = from; i < from + count; ++i) part.push_back(all.get(i));
  return part;
}

// x (1, T, hidden) at positions first .. first + T - 1; the layer's seven linear layers in the order q, k,
// v, o, gate, up, down, packed as q8_linear's (bits 8) or q4_linear's (bits 4) weights; cos and sin (T, D);
// the cache's keys and values (1, H_kv, >= first + T, D), float32 or float16, this forward's written at
// first .. first + T - 1 (rounded to their dtype as a copy rounds). Returns x after the layer.
at::Tensor decoder_layer(const at::Tensor& x, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                         at::TensorList q, at::TensorList scales, at::TensorList offsets,
                         const c10::List<c10::optional<at::Tensor>>& biases, c10::IntArrayRef bits, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& keys, const at::Tensor& values, int64_t first,
                         double scale, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(q.size() == 7 && scales.size() == 7 && offsets.size() == 7 && biases.size() == 7 && bits.size() == 7,
              "decoder_layer: seven linear layers (q, k, v, o, gate, up, down)");
  TORCH_CHECK(x.dim() == 3 && x.size(0) == 1 && cos.dim() == 2 && x.size(1) == cos.size(0),
              "decoder_layer: x (1, T, hidden), cos and sin (T, D)");
  TORCH_CHECK(keys.dim() == 4 && values.dim() == 4 && keys.size(0) == 1 && values.size(0) == 1,
              "decoder_layer: the cache's keys and values (1, H_kv, positions, D)");
  const int64_t T = x.size(1), hidden = x.size(2), D = cos.size(1);
  TORCH_CHECK(first >= 0 && keys.size(2) >= first + T && values.size(2) >= first + T,
              "decoder_layer: room in the cache for this forward's positions");
  const auto linears = [&](const at::Tensor& input, size_t from, size_t count) {
    const c10::List<c10::optional<at::Tensor>> bias = some_of(biases, from, count);
    return int_linears("decoder_layer", input, q.slice(from, count), scales.slice(from, count),
                       offsets.slice(from, count), bias, bits.slice(from, count));
  };
  const std::vector<at::Tensor> qkv = linears(rms_norm(x, input_norm, eps), 0, 3);
  const at::Tensor query = rotary(qkv[0].narrow(-1, 0, heads * D), cos, sin, heads);  // (H, T, D)
  const at::Tensor key = rotary(qkv[1].narrow(-1, 0, kv_heads * D), cos, sin, kv_heads);
  const at::Tensor value = qkv[2].narrow(-1, 0, kv_heads * D).reshape({T, kv_heads, D}).transpose(0, 1);
  {
    c10::InferenceMode writing;  // the cache's buffers are inference tensors where a forward made them
    keys[0].narrow(1, first, T).copy_(key);
    values[0].narrow(1, first, T).copy_(value);
  }
  const at::Tensor attended = attention(query, keys[0], values[0], first, scale);  // (T, H, D)
  const at::Tensor attended_rows = attended.reshape({1, T, heads * D});
  const at::Tensor mixed = x + linears(attended_rows, 3, 1)[0].narrow(-1, 0, hidden);
  const std::vector<at::Tensor> gate_up = linears(rms_norm(mixed, post_norm, eps), 4, 2);
  const int64_t inner = q[6].size(1) * block_inputs(bits[6]);
  const at::Tensor activated = silu_mul(gate_up[0].narrow(-1, 0, inner), gate_up[1].narrow(-1, 0, inner));
  return mixed + linears(activated, 6, 1)[0].narrow(-1, 0, hidden);
}

}  // namespace
