// specedit's CPU kernels (built and loaded by model/kernels.py): products whose rows never depend on the
// rows beside them.
// - specedit::q8_linear(x, q, scales, offsets, bias) = x @ W^T + bias on int8 weights with a scale and an
//   offset per group of 32 inputs, W[n, k] = scales[n, k / 32] * (q[n, k] - 128) + offsets[n, k / 32], q
//   unsigned levels packed in panels of 16 outputs, 4 inputs a lane (q (N/16, K/4, 16 * 4), scales and
//   offsets (N/16, K/32, 16)), on activations quantized as it goes: per row and group of 32 inputs, levels
//   a = round(x * 127 / max|x|) in -127..127, each standing for d = max|x| / 127;
// - specedit::q8_quantize(w): those (q, scales, offsets) from (N, K) weights (model/quantized.py);
// - specedit::f32_bmm(x, w), a batch of products on float32 weights, without bias: (B, M, K) by
//   (B / G, N/16, K, 16) packed in panels of 16 outputs (attention's products, a head each, G heads
//   sharing keys and values: model/invariant.py).
// Activations and results are float32.
//
// Row-invariant by construction, which the engine's exactness rests on (see model/invariant.py): whatever
// the number of rows of x, the rows or outputs computed beside it, the thread count or the CPU,
// - q8_linear: each row's activations are quantized alone; per group, the sum of the 32 products of
//   integer levels is exact (in int32, however the instructions pair them); then each output is one chain
//   of float32 fused multiply-adds over the groups in order, from zero: acc += that sum * (scale * d),
//   acc += offset * (d * the sum of the row's levels), then the bias added;
// - f32_bmm: each output is one chain of fused multiply-adds over k = 0..K-1 in order, from zero.
// Only the blocking changes with the number of rows. q8_linear streams its weights once for a forward of a
// few rows (the weights' bytes are the cost) and keeps a block of panels in the cache for the row blocks
// of a larger one (the arithmetic is the cost): 4 byte products a lane per instruction (AVX-512 VNNI's
// vpdpbusd), or 2 then 2 (AVX2's vpmaddubsw then vpmaddwd). f32_bmm: up to 4 rows stream the weights,
// more run a register-blocked kernel (6 rows by 16 or 64 outputs) over them, as a float32 GEMM would.
// Compiled for AVX2 (8 lanes a vector) or AVX-512 (16), with VNNI or without: each lane is an output,
// computed the same way, bit for bit.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace {

// The vectors the kernels compute with: AVX-512's 16 lanes where the library is compiled for it (and not
// told SPECEDIT_256), AVX2's 8 otherwise. A lane is an output: its arithmetic is the same in either.
#if defined(__AVX512F__) && !defined(SPECEDIT_256)
using Vec = __m512;
using IVec = __m512i;  // 16 int32 lanes, or 64 bytes: 4 of each lane's output
constexpr int kLanes = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
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
inline void store_int8(int8_t* p, Vec levels) {  // levels in -127..127
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(levels)));
}
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline IVec ibroadcast(int32_t v) { return _mm512_set1_epi32(v); }
inline Vec to_float(IVec v) { return _mm512_cvtepi32_ps(v); }
#if defined(__AVX512VNNI__)
// VNNI: vpdpbusd sums 4 products of unsigned weights' levels u and signed activations' a into each lane,
// exactly. Sum (u - 128) * a = that - 128 * sum a (`biased`: the group's correction, `centred`).
struct Prepared { IVec u; };
constexpr bool kBiased = true;
inline Prepared prepare(IVec u) { return {u}; }
inline IVec dot4(IVec acc, const Prepared& w, IVec a) { return _mm512_dpbusd_epi32(acc, w.u, a); }
inline IVec centred(IVec sums, int32_t levels) { return _mm512_sub_epi32(sums, _mm512_set1_epi32(128 * levels)); }
#else
// AVX-512 without VNNI: the weights' signed levels q = u - 128; |q| * (a with q's sign) paired into 16-bit
// sums by vpmaddubsw (|q| <= 128, |a| <= 127: a pair never saturates), then into 32-bit by vpmaddwd.
struct Prepared { IVec magnitude; __mmask64 negative; };
constexpr bool kBiased = false;
inline Prepared prepare(IVec u) {
  const IVec q = _mm512_xor_si512(u, _mm512_set1_epi8(static_cast<char>(0x80)));
  return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)};
}
inline IVec dot4(IVec acc, const Prepared& w, IVec a) {
  const IVec signed_a = _mm512_mask_sub_epi8(a, w.negative, _mm512_setzero_si512(), a);
  const IVec pairs = _mm512_maddubs_epi16(w.magnitude, signed_a);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
inline IVec centred(IVec sums, int32_t) { return sums; }
#endif
#else
using Vec = __m256;
using IVec = __m256i;
constexpr int kLanes = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
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
inline void store_int8(int8_t* p, Vec levels) {  // levels in -127..127
  const __m256i words = _mm256_cvtps_epi32(levels);
  const __m128i shorts = _mm_packs_epi32(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(shorts, shorts));
}
inline IVec izero() { return _mm256_setzero_si256(); }
inline IVec iload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline IVec ibroadcast(int32_t v) { return _mm256_set1_epi32(v); }
inline Vec to_float(IVec v) { return _mm256_cvtepi32_ps(v); }
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__)
// AVX-VNNI (most laptops since 2021), or AVX-512 VNNI's instruction on 8 lanes: as on 16 lanes above.
struct Prepared { IVec u; };
constexpr bool kBiased = true;
inline Prepared prepare(IVec u) { return {u}; }
#if defined(__AVXVNNI__)
inline IVec dot4(IVec acc, const Prepared& w, IVec a) { return _mm256_dpbusd_avx_epi32(acc, w.u, a); }
#else
inline IVec dot4(IVec acc, const Prepared& w, IVec a) { return _mm256_dpbusd_epi32(acc, w.u, a); }
#endif
inline IVec centred(IVec sums, int32_t levels) { return _mm256_sub_epi32(sums, _mm256_set1_epi32(128 * levels)); }
#else
// AVX2: as AVX-512 without VNNI, q's sign put on a by vpsignb.
struct Prepared { IVec magnitude, q; };
constexpr bool kBiased = false;
inline Prepared prepare(IVec u) {
  const IVec q = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
  return {_mm256_abs_epi8(q), q};
}
inline IVec dot4(IVec acc, const Prepared& w, IVec a) {
  const IVec pairs = _mm256_maddubs_epi16(w.magnitude, _mm256_sign_epi8(a, w.q));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline IVec centred(IVec sums, int32_t) { return sums; }
#endif
#endif

// The loops over a block's rows, panels and vectors are unrolled whole, so that its accumulators live in
// registers (GCC left them on the stack otherwise: AVX2 forwards of 8+ rows took twice as long).
#define UNROLL _Pragma("GCC unroll 16")

constexpr int64_t kGroup = 32;            // weights per scale and offset, along k
constexpr int64_t kPanel = 16;            // outputs per panel
constexpr int kVectors = kPanel / kLanes;  // vectors per panel: 2 (AVX2) or 1 (AVX-512)
constexpr int kDirectRows = 4;            // forwards of up to this many rows stream the weights once
// f32_bmm's register block: 6 rows by 16 outputs on AVX2 (12 accumulators of its 16 registers), 6 rows
// by 64 outputs on AVX-512 (24 of 32): enough multiply-adds in flight, few loads for each.
constexpr int kBlockRows = 6;
constexpr int kBlockPanels = kVectors == 2 ? 1 : 4;

// ---- float32 weights (f32_bmm) ----

// `body.template operator()<n>()` for the run-time count n in 1..N: a block's rows or panels as a template
// argument, so that its loops unroll whole.
template <int N, typename Body>
void by_count(int n, const Body& body) {
  if constexpr (N > 1) {
    if (n < N) return by_count<N - 1>(n, body);
  }
  body.template operator()<N>();
}

// R rows by P panels of float32 weights `v` (P x K x 16 floats, read as they are), register-blocked: the
// one chain of multiply-adds per output.
template <int R, int P>
void block(const float* x, const float* v, int64_t K, float* out, int64_t N) {
  Vec acc[R][P][kVectors];
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) acc[r][p][h] = zero();
  for (int64_t k = 0; k < K; ++k) {
    Vec w[P][kVectors];
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) w[p][h] = load(v + (p * K + k) * kPanel + h * kLanes);
    UNROLL for (int r = 0; r < R; ++r) {
      const Vec a = broadcast(x + r * K + k);
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) acc[r][p][h] = madd(a, w[p][h], acc[r][p][h]);
    }
  }
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) store(out + r * N + p * kPanel + h * kLanes, acc[r][p][h]);
}

// Panels [first, last) of float32 weights `w` for a forward of M rows: up to 4 rows, P panels at a time (R
// rows x P panels x vectors = 8 accumulators) as the weights stream by; more, kBlockPanels at a time, the
// rows in blocks of kBlockRows.
void f32_panels(const float* x, int64_t M, const float* w, int64_t K, int64_t first, int64_t last, float* out,
                int64_t N) {
  const auto weights = [&](int64_t panel) { return w + panel * K * kPanel; };
  if (M <= kDirectRows) {
    return by_count<kDirectRows>(static_cast<int>(M), [&]<int R>() {
      constexpr int P = std::max(1, 8 / (R * kVectors));
      int64_t panel = first;
      for (; panel + P <= last; panel += P) block<R, P>(x, weights(panel), K, out + panel * kPanel, N);
      for (; panel < last; ++panel) block<R, 1>(x, weights(panel), K, out + panel * kPanel, N);
    });
  }
  for (int64_t panel = first; panel < last; panel += kBlockPanels) {
    const int panels = static_cast<int>(std::min<int64_t>(kBlockPanels, last - panel));
    for (int64_t m = 0; m < M; m += kBlockRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, M - m));
      by_count<kBlockPanels>(panels, [&]<int P>() {
        by_count<kBlockRows>(rows, [&]<int R>() {
          block<R, P>(x + m * K, weights(panel), K, out + m * N + panel * kPanel, N);
        });
      });
    }
  }
}

// ---- int8 weights (q8_linear) ----

constexpr int64_t kQuad = 4;                     // inputs a lane sums per instruction
constexpr int64_t kQuadBytes = kPanel * kQuad;   // a panel's weights for 4 inputs: 64 bytes
// The int8 register block for forwards of many rows: 6 rows by 16 outputs (AVX2) or 48 (AVX-512), the
// fastest of 2-8 rows by 16-64 outputs for the 0.5B model's layers (2026-12, Intel Xeon, 2 threads).
constexpr int kIntRows = 6;
constexpr int kIntPanels = kVectors == 2 ? 1 : 3;

struct Int8Weights {
  const uint8_t* q;      // (panels, K/4, 64): panel p's outputs n at inputs 4j..4j+3: bytes 4n..4n+3 of quad j
  const float* scales;   // (panels, K/32, 16)
  const float* offsets;  // (panels, K/32, 16)
  const float* bias;     // (N) or null
  int64_t K;
};

// A forward's activations quantized (`quantize_row`), row r's at r * K and r * K/32.
struct Levels {
  const int8_t* a;        // (M, K): round(x * 127 / max|x|), in -127..127
  const float* step;      // (M, K/32): d = max|x| / 127 of the group (0 for a group of zeros)
  const float* total;     // (M, K/32): d * (sum of the group's levels)
  const int32_t* sum;     // (M, K/32): the sum of the group's levels
  int64_t K;
};

// Row x (K floats) quantized into its levels, per group of 32: d = max|x| / 127, a = round(x * (127 /
// max|x|)), to even; a group of zeros has d = 0 and levels 0. Elementwise, so every vector width agrees.
void quantize_row(const float* x, int64_t K, int8_t* a, float* step, float* total, int32_t* sum) {
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xs = x + g * kGroup;
    Vec high = zero();
    UNROLL for (int i = 0; i < kGroup; i += kLanes) high = greater(high, magnitude(load(xs + i)));
    const float largest = greatest(high);
    const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
    const Vec scale = broadcast(&inverse);
    UNROLL for (int i = 0; i < kGroup; i += kLanes) store_int8(a + g * kGroup + i, rounded(mul(load(xs + i), scale)));
    int32_t levels = 0;
    for (int i = 0; i < kGroup; ++i) levels += a[g * kGroup + i];
    step[g] = largest / 127.0f;
    sum[g] = levels;
    total[g] = step[g] * static_cast<float>(levels);
  }
}

// R rows (from `row`) by P panels (from `panel`): per group, the exact integer sums of the 32 products,
// then the group's two fused multiply-adds per output (see the top of this file).
template <int R, int P>
void int8_block(const Levels& x, int64_t row, const Int8Weights& w, int64_t panel, float* out, int64_t N) {
  const int64_t K = w.K, groups = K / kGroup, quads = K / kQuad;
  Vec acc[R][P][kVectors];
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) acc[r][p][h] = zero();
  for (int64_t g = 0; g < groups; ++g) {
    IVec sums[R][P][kVectors];
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) sums[r][p][h] = izero();
    UNROLL for (int j = 0; j < kGroup / kQuad; ++j) {
      const int64_t quad = g * (kGroup / kQuad) + j;
      IVec a[R];
      UNROLL for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x.a + (row + r) * K + quad * kQuad, sizeof four);
        a[r] = ibroadcast(four);
      }
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) {
          const Prepared weights = prepare(iload(w.q + ((panel + p) * quads + quad) * kQuadBytes + h * kLanes * kQuad));
          UNROLL for (int r = 0; r < R; ++r) sums[r][p][h] = dot4(sums[r][p][h], weights, a[r]);
        }
    }
    UNROLL for (int r = 0; r < R; ++r) {
      const int64_t at = (row + r) * groups + g;
      const Vec step = broadcast(x.step + at), total = broadcast(x.total + at);
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) {
          const int64_t group = ((panel + p) * groups + g) * kPanel + h * kLanes;
          const IVec exact = kBiased ? centred(sums[r][p][h], x.sum[at]) : sums[r][p][h];
          acc[r][p][h] = madd(to_float(exact), mul(load(w.scales + group), step), acc[r][p][h]);
          acc[r][p][h] = madd(load(w.offsets + group), total, acc[r][p][h]);
        }
    }
  }
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) {
        const int64_t n = (panel + p) * kPanel + h * kLanes;
        store(out + (row + r) * N + n, w.bias ? add(acc[r][p][h], load(w.bias + n)) : acc[r][p][h]);
      }
}

// Panels [first, last) for a forward of M rows: up to 4 rows, 4 panels at a time as the weights stream by
// (each weight read once); more, kIntPanels at a time (in the cache), the rows in blocks of kIntRows.
void int8_panels(const Levels& x, int64_t M, const Int8Weights& w, int64_t first, int64_t last, float* out,
                 int64_t N) {
  if (M <= kDirectRows) {
    return by_count<kDirectRows>(static_cast<int>(M), [&]<int R>() {
      int64_t panel = first;
      for (; panel + 4 <= last; panel += 4) int8_block<R, 4>(x, 0, w, panel, out, N);
      for (; panel < last; ++panel) int8_block<R, 1>(x, 0, w, panel, out, N);
    });
  }
  for (int64_t panel = first; panel < last;) {
    const bool whole = panel + kIntPanels <= last;
    for (int64_t m = 0; m < M; m += kIntRows) {
      by_count<kIntRows>(static_cast<int>(std::min<int64_t>(kIntRows, M - m)), [&]<int R>() {
        if (whole)
          int8_block<R, kIntPanels>(x, m, w, panel, out, N);
        else
          int8_block<R, 1>(x, m, w, panel, out, N);
      });
    }
    panel += whole ? kIntPanels : 1;
  }
}

at::Tensor q8_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 3 && q.size(2) == kQuadBytes && q.is_contiguous(),
              "q8_linear: uint8 weights packed as (N/16, K/4, 64)");
  const int64_t panels = q.size(0), K = q.size(1) * kQuad, N = panels * kPanel, groups = K / kGroup;
  TORCH_CHECK(K % kGroup == 0, "q8_linear: the input size must be a multiple of 32");
  for (const at::Tensor* t : {&scales, &offsets})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == N * groups,
                "q8_linear: float32 scales and offsets packed as (N/16, K/32, 16)");
  TORCH_CHECK(input.scalar_type() == at::kFloat, "q8_linear: float32 activations");
  TORCH_CHECK(input.size(-1) == K, "q8_linear: the input has ", input.size(-1), " features, the weights ", K);
  Int8Weights w{q.data_ptr<uint8_t>(), scales.data_ptr<float>(), offsets.data_ptr<float>(), nullptr, K};
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    bias_f = bias->contiguous();
    TORCH_CHECK(bias_f.scalar_type() == at::kFloat && bias_f.numel() == N, "q8_linear: a float32 bias of N");
    w.bias = bias_f.data_ptr<float>();
  }
  const at::Tensor x = input.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = N;
  at::Tensor out = at::empty({M, N}, input.options());
  if (M == 0) return out.view(shape);
  at::Tensor levels = at::empty({M, K}, input.options().dtype(at::kChar));
  at::Tensor steps = at::empty({3, M, groups}, input.options());  // step, total, and the sums as int32 bits
  const float* xp = x.data_ptr<float>();
  int8_t* ap = levels.data_ptr<int8_t>();
  float* sp = steps.data_ptr<float>();
  int32_t* sums = reinterpret_cast<int32_t*>(sp + 2 * M * groups);
  at::parallel_for(0, M, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      quantize_row(xp + r * K, K, ap + r * K, sp + r * groups, sp + (M + r) * groups, sums + r * groups);
  });
  const Levels a{ap, sp, sp + M * groups, sums, K};
  float* op = out.data_ptr<float>();
  // A chunk of panels per thread; grains of 8 keep the few-row kernel's blocks of panels whole.
  at::parallel_for(0, panels, 8, [&](int64_t first, int64_t last) { int8_panels(a, M, w, first, last, op, N); });
  return out.view(shape);
}

// A batch of products: input (B, M, K), weights (B / G, N/16, K, 16) -> (B, M, N), product b on weights
// b / G (G inputs share weights: grouped-query attention's heads), each row computed alone (attention's
// scores and weighted values, one product per head).
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
      f32_panels(xp + b * M * K, M, wp + (b / group) * panels * K * kPanel, K, item - b * panels, stop - b * panels,
                 op + b * M * N, N);
      item = stop;
    }
  });
  return out;
}

// One panel's weights quantized (see q8_quantize): rows [panel * 16, +16) of w (N, K), rows past N zeros.
template <typename T>
void quantize_panel(const T* w, int64_t N, int64_t K, int64_t panel, uint8_t* q, float* scales, float* offsets) {
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
        const int64_t k = g * kGroup + i;
        q[(panel * (K / kQuad) + k / kQuad) * kQuadBytes + r * kQuad + k % kQuad] =
            static_cast<uint8_t>(std::clamp(level, -128.0f, 127.0f) + 128.0f);
      }
    }
  }
}

// (N, K) weights -> q8_linear's (q, scales, offsets): per group of 32 inputs, 256 levels from the group's
// lowest weight to its highest, scale = (high - low) / 255, offset = low + 128 * scale, q = round((w -
// offset) / scale) + 128; N padded with zero rows to a multiple of 16. One pass over the weights, a panel per
// task (the same arithmetic in torch's ops took 3 s for the 0.5B model's weights, most of its load).
std::tuple<at::Tensor, at::Tensor, at::Tensor> q8_quantize(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % kGroup == 0, "q8_quantize: (N, K) weights, K a multiple of 32");
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + kPanel - 1) / kPanel;
  at::Tensor q = at::empty({panels, K / kQuad, kQuadBytes}, w.options().dtype(at::kByte));
  at::Tensor scales = at::empty({panels, K / kGroup, kPanel}, w.options().dtype(at::kFloat));
  at::Tensor offsets = at::empty_like(scales);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w.scalar_type(), "q8_quantize", [&] {
    const scalar_t* wp = w.data_ptr<scalar_t>();
    at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t panel = first; panel < last; ++panel)
        quantize_panel(wp, N, K, panel, q.data_ptr<uint8_t>(), scales.data_ptr<float>(), offsets.data_ptr<float>());
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
