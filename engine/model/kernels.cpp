// specedit's CPU kernels (built and loaded by model/kernels.py): products whose rows never depend on the
// rows beside them.
// - specedit::q8_linear(x, q, scales, offsets, bias) = x @ W^T + bias on int8 weights with a scale and an
//   offset per group of 32 inputs, W[n, k] = scales[n, k / 32] * q[n, k] + offsets[n, k / 32], packed in
//   panels of 16 outputs (q (N/16, K, 16), scales and offsets (N/16, K/32, 16));
// - specedit::q8_quantize(w): those (q, scales, offsets) from (N, K) weights (model/quantized.py);
// - specedit::f32_bmm(x, w), a batch of such products on float32 weights, without bias: (B, M, K) by
//   (B / G, N/16, K, 16) packed as the int8 ones (attention's products, a head each, G heads sharing
//   keys and values: model/invariant.py).
// Activations and results are float32.
//
// Row-invariant by construction, which the engine's exactness rests on (see model/invariant.py): every
// output is one chain of fused multiply-adds over k = 0..K-1 in order, from zero, on weights dequantized
// by one fused multiply-add each (int8) or read as they are (float32), then the bias added; whatever the number of rows of x, the rows or
// outputs computed beside it, or the thread count. Only the blocking changes with the number of rows:
// - up to 4 rows (plain decoding, short drafts: the weights' bytes are the cost), the weights are
//   dequantized in registers as they stream, a quarter of float32's bytes;
// - more rows (verification of long drafts, prefill: the arithmetic is the cost), a panel of 16 outputs
//   is dequantized once into a buffer that stays in the cache, and a register-blocked kernel (6 rows by
//   16 or 64 outputs) runs over it, as a float32 GEMM would.
// Compiled for AVX2 (8 floats a vector) or AVX-512 (16): each lane is an output, computed the same way.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace {

// The vector the kernels compute with: AVX-512's 16 floats where the library is compiled for it, AVX2's 8
// otherwise. A lane is an output: the arithmetic of each output is the same in either, bit for bit.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vec madd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec widen(const int8_t* q) {  // kLanes int8 -> float
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}
#else
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Vec madd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec widen(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}
#endif

// The loops over a block's rows, panels and vectors are unrolled whole, so that its accumulators live in
// registers (GCC left them on the stack otherwise: AVX2 forwards of 8+ rows took twice as long).
#define UNROLL _Pragma("GCC unroll 16")

constexpr int64_t kGroup = 32;            // weights per scale and offset, along k
constexpr int64_t kPanel = 16;            // outputs per panel
constexpr int kVectors = kPanel / kLanes;  // vectors per panel: 2 (AVX2) or 1 (AVX-512)
constexpr int kDirectRows = 4;            // forwards of up to this many rows dequantize in registers
// The buffered kernel's block: 6 rows by 16 outputs on AVX2 (12 accumulators of its 16 registers), 6 rows
// by 64 outputs on AVX-512 (24 of 32): enough multiply-adds in flight, few loads for each.
constexpr int kBlockRows = 6;
constexpr int kBlockPanels = kVectors == 2 ? 1 : 4;

struct Weights {
  const int8_t* q;      // (panels, K, 16), or null for float32 weights
  const float* scales;  // (panels, K / 32, 16)
  const float* offsets; // (panels, K / 32, 16)
  const float* f;       // (panels, K, 16) float32 weights, where q is null
  const float* bias;    // (N) or null
  int64_t K;
};

// Vector `part` of panel `panel`'s weights at input k, as the kernels compute with them: dequantized by one
// fused multiply-add (int8), or read (float32).
inline Vec weights_at(const Weights& w, int64_t panel, int64_t k, int part) {
  const int64_t at = (panel * w.K + k) * kPanel + part * kLanes;
  if (!w.q) return load(w.f + at);
  const int64_t group = (panel * (w.K / kGroup) + k / kGroup) * kPanel + part * kLanes;
  return madd(widen(w.q + at), load(w.scales + group), load(w.offsets + group));
}

inline void finish(float* out, Vec acc, const float* bias) { store(out, bias ? add(acc, load(bias)) : acc); }

// R rows by P panels, register-blocked: `weight(p, k, h)` is vector h of the p-th panel's weights at input
// k; `out` and `bias` start at the first panel's outputs. The one chain of multiply-adds per output.
template <int R, int P, typename Weight>
void block(const float* x, int64_t K, Weight weight, float* out, int64_t N, const float* bias) {
  Vec acc[R][P][kVectors];
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) acc[r][p][h] = zero();
  for (int64_t k = 0; k < K; ++k) {
    Vec v[P][kVectors];
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) v[p][h] = weight(p, k, h);
    UNROLL for (int r = 0; r < R; ++r) {
      const Vec a = broadcast(x + r * K + k);
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) acc[r][p][h] = madd(a, v[p][h], acc[r][p][h]);
    }
  }
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) {
        const int64_t n = p * kPanel + h * kLanes;
        finish(out + r * N + n, acc[r][p][h], bias ? bias + n : nullptr);
      }
}

// R rows (<= 4) by P panels from `panel` on, the weights dequantized as they stream by.
template <int R, int P>
void direct(const float* x, const Weights& w, int64_t panel, float* out, int64_t N) {
  const auto weight = [&](int p, int64_t k, int h) { return weights_at(w, panel + p, k, h); };
  const int64_t n = panel * kPanel;
  block<R, P>(x, w.K, weight, out + n, N, w.bias ? w.bias + n : nullptr);
}

// R rows (<= kBlockRows) by P panels whose weights `v` (P x K x 16 floats) are read as they are.
template <int R, int P>
void buffered(const float* x, const float* v, int64_t K, float* out, int64_t N, const float* bias) {
  const auto weight = [&](int p, int64_t k, int h) { return load(v + (p * K + k) * kPanel + h * kLanes); };
  block<R, P>(x, K, weight, out, N, bias);
}

template <int P, int R = kBlockRows>
void buffered_rows(int rows, const float* x, const float* v, int64_t K, float* out, int64_t N, const float* bias) {
  if constexpr (R > 1) {
    if (rows < R) return buffered_rows<P, R - 1>(rows, x, v, K, out, N, bias);
  }
  buffered<R, P>(x, v, K, out, N, bias);
}

template <int P = kBlockPanels>
void buffered_panels(int panels, int rows, const float* x, const float* v, int64_t K, float* out, int64_t N,
                     const float* bias) {
  if constexpr (P > 1) {
    if (panels < P) return buffered_panels<P - 1>(panels, rows, x, v, K, out, N, bias);
  }
  buffered_rows<P>(rows, x, v, K, out, N, bias);
}

// Panels [first, last) for a forward of M > kDirectRows rows, kBlockPanels at a time: their weights
// dequantized once into a buffer that stays in the cache (float32 ones are read where they are), then
// the rows in blocks of kBlockRows.
void panels_buffered(const float* x, int64_t M, const Weights& w, int64_t first, int64_t last, float* out,
                     int64_t N) {
  const int64_t K = w.K;
  std::vector<float> buffer(w.q ? static_cast<size_t>(kBlockPanels * K * kPanel) : 0);
  for (int64_t panel = first; panel < last; panel += kBlockPanels) {
    const int panels = static_cast<int>(std::min<int64_t>(kBlockPanels, last - panel));
    const float* v = w.f ? w.f + panel * K * kPanel : buffer.data();
    for (int p = 0; w.q && p < panels; ++p)
      for (int64_t k = 0; k < K; ++k)
        for (int h = 0; h < kVectors; ++h)
          store(buffer.data() + (p * K + k) * kPanel + h * kLanes, weights_at(w, panel + p, k, h));
    const int64_t n = panel * kPanel;
    const float* bias = w.bias ? w.bias + n : nullptr;
    for (int64_t m = 0; m < M; m += kBlockRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, M - m));
      buffered_panels(panels, rows, x + m * K, v, K, out + m * N + n, N, bias);
    }
  }
}

// Panels [first, last) for a forward of M <= kDirectRows rows, P panels at a time: 8 accumulators.
template <int R>
void panels_direct_rows(const float* x, const Weights& w, int64_t first, int64_t last, float* out, int64_t N) {
  constexpr int P = 8 / (R * kVectors) > 0 ? 8 / (R * kVectors) : 1;
  int64_t panel = first;
  for (; panel + P <= last; panel += P) direct<R, P>(x, w, panel, out, N);
  for (; panel < last; ++panel) direct<R, 1>(x, w, panel, out, N);
}

void panels_direct(const float* x, int64_t M, const Weights& w, int64_t first, int64_t last, float* out,
                   int64_t N) {
  switch (M) {
    case 1: panels_direct_rows<1>(x, w, first, last, out, N); break;
    case 2: panels_direct_rows<2>(x, w, first, last, out, N); break;
    case 3: panels_direct_rows<3>(x, w, first, last, out, N); break;
    default: panels_direct_rows<4>(x, w, first, last, out, N); break;
  }
}

// x @ W^T + bias for `w`'s weights (the bias, if any, taken into `w`), in chunks of panels per thread.
at::Tensor linear(const at::Tensor& input, Weights w, int64_t panels, const c10::optional<at::Tensor>& bias,
                  const char* name) {
  const int64_t K = w.K, N = panels * kPanel;
  TORCH_CHECK(input.scalar_type() == at::kFloat, name, ": float32 activations");
  TORCH_CHECK(input.size(-1) == K, name, ": the input has ", input.size(-1), " features, the weights ", K);
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    bias_f = bias->contiguous();
    TORCH_CHECK(bias_f.scalar_type() == at::kFloat && bias_f.numel() == N, name, ": a float32 bias of N");
    w.bias = bias_f.data_ptr<float>();
  }
  at::Tensor x = input.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = N;
  at::Tensor out = at::empty({M, N}, input.options());
  if (M == 0) return out.view(shape);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // A chunk of panels per thread; grains of 8 keep the one-row kernel's blocks of panels whole.
  at::parallel_for(0, panels, 8, [&](int64_t first, int64_t last) {
    if (M <= kDirectRows)
      panels_direct(xp, M, w, first, last, op, N);
    else
      panels_buffered(xp, M, w, first, last, op, N);
  });
  return out.view(shape);
}

at::Tensor q8_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 3 && q.size(2) == kPanel && q.is_contiguous(),
              "q8_linear: int8 weights packed as (N/16, K, 16)");
  const int64_t panels = q.size(0), K = q.size(1), N = panels * kPanel;
  TORCH_CHECK(K % kGroup == 0, "q8_linear: the input size must be a multiple of 32");
  for (const at::Tensor* t : {&scales, &offsets})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == N * (K / kGroup),
                "q8_linear: float32 scales and offsets packed as (N/16, K/32, 16)");
  const Weights w{q.data_ptr<int8_t>(), scales.data_ptr<float>(), offsets.data_ptr<float>(), nullptr, nullptr, K};
  return linear(input, w, panels, bias, "q8_linear");
}

// A batch of products: input (B, M, K), weights (B / G, N/16, K, 16) -> (B, M, N), product b on weights
// b / G (G inputs share weights: grouped-query attention's heads), each row computed as q8_linear computes
// one (attention's scores and weighted values, one product per head).
at::Tensor f32_bmm(const at::Tensor& input, const at::Tensor& weights) {
  TORCH_CHECK(input.scalar_type() == at::kFloat && input.dim() == 3, "f32_bmm: float32 (B, M, K) input");
  TORCH_CHECK(weights.scalar_type() == at::kFloat && weights.dim() == 4 && weights.size(3) == kPanel &&
                  weights.is_contiguous() && weights.size(2) == input.size(2) && weights.size(0) > 0 &&
                  input.size(0) % weights.size(0) == 0,
              "f32_bmm: float32 weights packed as (B / G, N/16, K, 16)");
  const int64_t B = input.size(0), M = input.size(1), K = input.size(2), panels = weights.size(1);
  const int64_t N = panels * kPanel, group = B / weights.size(0);
  at::Tensor x = input.contiguous();
  at::Tensor out = at::empty({B, M, N}, input.options());
  if (M == 0 || B == 0) return out;
  const float* xp = x.data_ptr<float>();
  const float* wp = weights.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B * panels, 8, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last;) {  // the items of one product at a time
      const int64_t b = item / panels, stop = std::min(last, (b + 1) * panels);
      const Weights w{nullptr, nullptr, nullptr, wp + (b / group) * panels * K * kPanel, nullptr, K};
      if (M <= kDirectRows)
        panels_direct(xp + b * M * K, M, w, item - b * panels, stop - b * panels, op + b * M * N, N);
      else
        panels_buffered(xp + b * M * K, M, w, item - b * panels, stop - b * panels, op + b * M * N, N);
      item = stop;
    }
  });
  return out;
}

// One panel's weights quantized (see q8_quantize): rows [panel * 16, +16) of w (N, K), rows past N zeros.
template <typename T>
void quantize_panel(const T* w, int64_t N, int64_t K, int64_t panel, int8_t* q, float* scales, float* offsets) {
  float row[kGroup];
  for (int r = 0; r < kPanel; ++r) {
    const int64_t n = panel * kPanel + r;
    for (int64_t g = 0; g < K / kGroup; ++g) {
      float low = 0.0f, high = 0.0f;
      for (int i = 0; i < kGroup; ++i) {
        row[i] = n < N ? static_cast<float>(w[n * K + g * kGroup + i]) : 0.0f;
        low = i == 0 ? row[i] : std::min(low, row[i]);
        high = i == 0 ? row[i] : std::max(high, row[i]);
      }
      // Each operation rounded on its own, as torch's would be (-ffp-contract=off: no fused multiply-add).
      const float scale = std::max((high - low) / 255.0f, std::numeric_limits<float>::min());
      const float offset = low + 128.0f * scale;
      const int64_t at = (panel * (K / kGroup) + g) * kPanel + r;
      scales[at] = scale;
      offsets[at] = offset;
      for (int i = 0; i < kGroup; ++i) {
        const float level = std::nearbyint((row[i] - offset) / scale);  // to even, as torch.round
        q[(panel * K + g * kGroup + i) * kPanel + r] = static_cast<int8_t>(std::clamp(level, -128.0f, 127.0f));
      }
    }
  }
}

// (N, K) weights -> q8_linear's (q, scales, offsets): per group of 32 inputs, 256 levels from the group's
// lowest weight to its highest, scale = (high - low) / 255, offset = low + 128 * scale, q = round((w -
// offset) / scale); N padded with zero rows to a multiple of 16. One pass over the weights, a panel per
// task (the same arithmetic in torch's ops took 3 s for the 0.5B model's weights, most of its load).
std::tuple<at::Tensor, at::Tensor, at::Tensor> q8_quantize(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % kGroup == 0, "q8_quantize: (N, K) weights, K a multiple of 32");
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + kPanel - 1) / kPanel;
  at::Tensor q = at::empty({panels, K, kPanel}, w.options().dtype(at::kChar));
  at::Tensor scales = at::empty({panels, K / kGroup, kPanel}, w.options().dtype(at::kFloat));
  at::Tensor offsets = at::empty_like(scales);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w.scalar_type(), "q8_quantize", [&] {
    const scalar_t* wp = w.data_ptr<scalar_t>();
    at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t panel = first; panel < last; ++panel)
        quantize_panel(wp, N, K, panel, q.data_ptr<int8_t>(), scales.data_ptr<float>(), offsets.data_ptr<float>());
    });
  });
  return {q, scales, offsets};
}

}  // namespace

TORCH_LIBRARY(specedit, m) {
  m.def("q8_linear(Tensor input, Tensor q, Tensor scales, Tensor offsets, Tensor? bias) -> Tensor");
  m.def("q8_quantize(Tensor weight) -> (Tensor, Tensor, Tensor)");
  m.def("f32_bmm(Tensor input, Tensor weights) -> Tensor");
}

TORCH_LIBRARY_IMPL(specedit, CPU, m) {
  m.impl("q8_linear", q8_linear);
  m.impl("q8_quantize", q8_quantize);
  m.impl("f32_bmm", f32_bmm);
}
