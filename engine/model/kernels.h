// What specedit's kernel families share: the float vectors they compute with, the packing constants of
// integer weights, the unrolling helpers, and the ops each family defines for the others.
//
// The library is one translation unit (kernels.cpp includes every family), so ATen's headers are parsed
// once a compile. Everything here sits in an anonymous namespace: the compiler sees across the families and
// inlines freely, and only the C ABI and the registered ops leave the library.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// The float vectors: AVX-512's 16 lanes where the library is compiled for it (and not told SPECEDIT_256),
// AVX2's 8 otherwise. A lane is an output: its arithmetic is the same in either.
#if defined(__AVX512F__) && !defined(SPECEDIT_256)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vec madd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec magnitude(Vec a) { return _mm512_abs_ps(a); }
inline Vec greater(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float greatest(Vec a) { return _mm512_reduce_max_ps(a); }
inline Vec rounded(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec splat(float v) { return _mm512_set1_ps(v); }
inline Vec subtract(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec divide(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec kept_if_at_most(Vec a, Vec b, Vec value, Vec otherwise) {  // a <= b ? value : otherwise, a lane each
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LE_OQ), otherwise, value);
}
inline Vec power_of_two(Vec n) {  // 2^n for integral n in -126..127
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#else
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Vec madd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec magnitude(Vec a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
inline Vec greater(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline float greatest(Vec a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline Vec rounded(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec splat(float v) { return _mm256_set1_ps(v); }
inline Vec subtract(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec divide(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec kept_if_at_most(Vec a, Vec b, Vec value, Vec otherwise) {
  return _mm256_blendv_ps(otherwise, value, _mm256_cmp_ps(a, b, _CMP_LE_OQ));
}
inline Vec power_of_two(Vec n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#endif

// e^x for x <= 0 (a score less the largest of its row), the same operations on every vector width: x = n ln 2
// + r, n = round(x / ln 2), r by two multiply-adds (ln 2 in two parts), e^r by Cephes' polynomial, 2^n put
// into the exponent. Within 2 ulp of e^x down to x = -87; below, it gives e^-87 (callers zero what they mask).
inline Vec exp_nonpositive(Vec x) {
  x = greater(x, splat(-87.0f));
  const Vec n = rounded(mul(x, splat(1.44269504088896341f)));
  Vec r = madd(n, splat(-0.693359375f), x);
  r = madd(n, splat(2.12194440e-4f), r);
  Vec y = splat(1.9875691500e-4f);
  y = madd(y, r, splat(1.3981999507e-3f));
  y = madd(y, r, splat(8.3334519073e-3f));
  y = madd(y, r, splat(4.1665795894e-2f));
  y = madd(y, r, splat(1.6666665459e-1f));
  y = madd(y, r, splat(5.0000001201e-1f));
  y = madd(y, mul(r, r), add(r, splat(1.0f)));
  return mul(y, power_of_two(n));
}

// The loops over a block's rows, panels and vectors are unrolled whole, so that its accumulators live in
// registers: GCC otherwise leaves them on the stack, at twice the time.
#define UNROLL _Pragma("GCC unroll 16")

// `body.template operator()<n>()` for the run-time count n in 1..N: a block's rows or panels as a template
// argument, so that its loops unroll whole.
template <int N, typename Body>
void by_count(int n, const Body& body) {
  if constexpr (N > 1) {
    if (n < N) return by_count<N - 1>(n, body);
  }
  body.template operator()<N>();
}

// Integer weights' packing (kernels_linears.cpp reads it, kernels_packing.cpp writes it, the C ABI wraps it).
// Inputs per scale and offset (a group), along k: 128 for int8 weights where the input size is a multiple
// of it, else 32, as 4- and 5-bit weights always take. A group's products are summed exactly in integers
// and scaled once, so wider groups scale less often. 4-bit levels over 128 inputs lose too much
// (docs/kernels.md, "What we tried").
constexpr int64_t kGroup = 32;
constexpr int64_t kWideGroup = 128;
constexpr int64_t kPanel = 16;                   // outputs per panel
constexpr int64_t kQuad = 4;                     // inputs a lane sums per instruction
constexpr int64_t kQuadBytes = kPanel * kQuad;   // a panel's weights for 4 inputs (8 at 4 bits): 64 bytes
template <int Bits>
constexpr int64_t kBlockInputs = Bits == 4 ? 2 * kQuad : kQuad;  // inputs a lane's 4 bytes hold
inline int64_t block_inputs(int64_t bits) { return bits == 4 ? kBlockInputs<4> : kBlockInputs<8>; }

// The ops, by family; kernels.cpp registers them with torch.
// kernels_linears.cpp: x @ W^T + bias on integer weights, one layer or several on one input.
std::vector<at::Tensor> int_linears(const char* name, const at::Tensor& input, at::TensorList qs,
                                    at::TensorList scales, at::TensorList offsets,
                                    const c10::List<c10::optional<at::Tensor>>& biases, c10::IntArrayRef bits);
at::Tensor q8_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias);
at::Tensor q5_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias);
at::Tensor q4_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias);
std::vector<at::Tensor> linears(const at::Tensor& input, at::TensorList q, at::TensorList scales,
                                at::TensorList offsets, const c10::List<c10::optional<at::Tensor>>& bias,
                                c10::IntArrayRef bits);
// kernels_packing.cpp: a layer's weights quantized and packed for those.
std::tuple<at::Tensor, at::Tensor, at::Tensor> q8_quantize(const at::Tensor& weight, int64_t group);
std::tuple<at::Tensor, at::Tensor, at::Tensor> q4_quantize(const at::Tensor& weight);
// kernels_attention.cpp: causal attention of one sequence's queries.
at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t first,
                     double scale);
// kernels_layer.cpp: a layer's elementwise glue, and a whole decoder layer in one call.
at::Tensor rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps);
at::Tensor rotary(const at::Tensor& states, const at::Tensor& cos, const at::Tensor& sin, int64_t heads);
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor decoder_layer(const at::Tensor& x, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                         at::TensorList q, at::TensorList scales, at::TensorList offsets,
                         const c10::List<c10::optional<at::Tensor>>& biases, c10::IntArrayRef bits, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& keys, const at::Tensor& values, int64_t first,
                         double scale, int64_t heads, int64_t kv_heads);

}  // namespace
