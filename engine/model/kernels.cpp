// specedit's CPU kernels (built and loaded by model/kernels.py): results whose rows never depend on the
// rows beside them.
// - specedit::q8_linear(x, q, scales, offsets, bias) = x @ W^T + bias on int8 weights with a scale and an
//   offset per group of G inputs (128, or 32 where K is not a multiple of 128), W[n, k] = scales[n, k / G] *
//   (q[n, k] - 128) + offsets[n, k / G], q unsigned levels packed in panels of 16 outputs, 4 inputs a lane
//   (q (N/16, K/4, 16 * 4), scales and offsets float16 (N/16, K/G, 16), widened to float32 exactly as they
//   are read), on activations quantized as it goes: per row and group of G inputs, levels a = round(x *
//   127 / max|x|) in -127..127, each standing for d = max|x| / 127 (kActivationTop);
// - specedit::q8_quantize(w, G): those (q, scales, offsets) from (N, K) weights (model/quantized.py);
// - specedit::q4_linear, specedit::q4_quantize: the same on 4-bit weights in groups of 32, W[n, k] =
//   scales[n, k / 32] * q[n, k] + offsets[n, k / 32], q in 0..15, two a byte: a lane's 8 inputs in 4 bytes,
//   the first 4 in the low nibbles (q (N/16, K/8, 16 * 4)); half the bytes of the int8 levels to stream at
//   every step;
// - specedit::q5_linear: the same on 5-bit weights in groups of 32, W[n, k] = scales[n, k / 32] * q[n, k] +
//   offsets[n, k / 32], q in 0..31 a byte, packed as the int8 levels (a GGUF's Q5_0 levels as they are:
//   model/gguf_levels.py); on AVX2 without VNNI one multiply-add where int8 takes two;
// - specedit::linears: several layers on one input (q, k and v; gate and up), each of its own width, the
//   activations quantized once per group size, each layer's outputs its own call's;
// - specedit::attention(query, key, value, first, scale): causal attention of one sequence's queries on
//   the keys and values of every position up to theirs, grouped-query heads (model/invariant.py): scores,
//   softmax and weighted values in one pass a block of queries; the keys and values float32 or float16 (a
//   cache of half the bytes), widened to float32 exactly as they are read;
// - specedit::rms_norm, specedit::rotary, specedit::silu_mul: a decoder layer's elementwise glue
//   (model/decoder.py), each output from its own row alone;
// - specedit::decoder_layer: a whole decoder layer of those ops in one call, this forward's keys and values
//   written into the cache's buffers on the way (model/decoder.py's Layer without its Python between them).
// Activations and results are float32.
//
// Row-invariant by construction, which the engine's exactness rests on (see model/invariant.py): whatever
// the number of rows of x, the rows or outputs computed beside it, the thread count or the CPU,
// - q8_linear, q5_linear, q4_linear: each row's activations are quantized alone; per group, the sum of the
//   G products of integer levels is exact (in int32, however the instructions pair them; 4-bit levels
//   without VNNI sum a group in 16-bit lanes first, 16 products of at most 15 * 127 each, 5-bit ones half a
//   group, 8 products of at most 31 * 127); then each output is one
//   chain of float32 fused multiply-adds over the groups in order, from zero: acc += that sum * (scale * d),
//   acc += offset * (d * the sum of the row's levels), then the bias added;
// - attention: each query's scores are chains of fused multiply-adds over the head's width in order, its
//   softmax runs over the keys up to its own position in their order, and so do its weighted values;
// - rms_norm, rotary, silu_mul: each output from its row's (or its element's) values alone, in scalar
//   order or one lane each.
// Only the blocking changes with the number of rows. q8_linear streams its weights once for a forward of a
// few rows (the weights' bytes are the cost) and keeps a block of panels in the cache for the row blocks
// of a larger one (the arithmetic is the cost): 4 byte products a lane per instruction (AVX-512 VNNI's
// vpdpbusd), or 2 and 2 as 16-bit words (AVX2's vpmaddwd), of the weights' unsigned levels u and the
// activations' a, less 128 * (the sum of a) a group (int4 and int5: 2 then 2, vpmaddubsw then vpmaddwd).
// attention reads each key once for a block of up to 64 queries, a query a lane.
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
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// Four bytes (four int8 levels, or two int16 ones) as one int32, to broadcast to every lane.
template <typename T>
inline int32_t four_bytes(const T* p) {
  int32_t four;
  std::memcpy(&four, p, sizeof four);
  return four;
}

// The vectors the kernels compute with: AVX-512's 16 lanes where the library is compiled for it (and not
// told SPECEDIT_256), AVX2's 8 otherwise. A lane is an output: its arithmetic is the same in either.
#if defined(__AVX512F__) && !defined(SPECEDIT_256)
using Vec = __m512;
using IVec = __m512i;  // 16 int32 lanes, or 64 bytes: 4 of each lane's output
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
inline void store_int8(int8_t* p, Vec levels) {  // levels in -127..127
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(levels)));
}
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline IVec ibroadcast(int32_t v) { return _mm512_set1_epi32(v); }
inline Vec to_float(IVec v) { return _mm512_cvtepi32_ps(v); }
inline Vec splat(float v) { return _mm512_set1_ps(v); }
inline Vec subtract(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec divide(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec kept_if_at_most(Vec a, Vec b, Vec value, Vec otherwise) {  // a <= b ? value : otherwise, a lane each
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LE_OQ), otherwise, value);
}
inline Vec power_of_two(Vec n) {  // 2^n for integral n in -126..127
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#if defined(__AVX512VNNI__)
// VNNI: vpdpbusd sums 4 products of unsigned weights' levels u (as stored: the level + 128) and signed
// activations' a into each lane.
inline IVec dot4(IVec acc, IVec u, IVec a) { return _mm512_dpbusd_epi32(acc, u, a); }
#else
// Without VNNI, 8-bit levels multiply as 16-bit words (`dot8`): a vector's words masked to their low bytes
// or shifted to their high ones, pairs of words times words summed into 32-bit lanes.
inline IVec even_words(IVec u) { return _mm512_and_si512(u, _mm512_set1_epi16(0x00FF)); }
inline IVec odd_words(IVec u) { return _mm512_srli_epi16(u, 8); }
inline IVec madd_words(IVec a, IVec b) { return _mm512_madd_epi16(a, b); }
inline IVec iadd(IVec a, IVec b) { return _mm512_add_epi32(a, b); }
// 4-bit levels u in 0..15 times a, by vpmaddubsw into 16-bit lanes: a group's 16 products a lane stay within
// 16 * 15 * 127 = 30,480, exact; widened to 32 bits (vpmaddwd) once a group by `small_sums`.
inline IVec dot4_small(IVec acc, IVec u, IVec a) { return _mm512_add_epi16(acc, _mm512_maddubs_epi16(u, a)); }
inline IVec small_sums(IVec acc) { return _mm512_madd_epi16(acc, _mm512_set1_epi16(1)); }
#endif
inline IVec centred(IVec sums, int32_t levels) { return _mm512_sub_epi32(sums, _mm512_set1_epi32(128 * levels)); }
// A 64-byte block of 4-bit levels: the low nibbles (the first 4 inputs of each lane's 8), the high ones.
inline IVec low_nibbles(IVec v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline IVec high_nibbles(IVec v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
#else
using Vec = __m256;
using IVec = __m256i;
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
inline void store_int8(int8_t* p, Vec levels) {  // levels in -127..127
  const __m256i words = _mm256_cvtps_epi32(levels);
  const __m128i shorts = _mm_packs_epi32(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(shorts, shorts));
}
inline IVec izero() { return _mm256_setzero_si256(); }
inline IVec iload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline IVec ibroadcast(int32_t v) { return _mm256_set1_epi32(v); }
inline Vec to_float(IVec v) { return _mm256_cvtepi32_ps(v); }
inline Vec splat(float v) { return _mm256_set1_ps(v); }
inline Vec subtract(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec divide(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec kept_if_at_most(Vec a, Vec b, Vec value, Vec otherwise) {
  return _mm256_blendv_ps(otherwise, value, _mm256_cmp_ps(a, b, _CMP_LE_OQ));
}
inline Vec power_of_two(Vec n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__)
// AVX-VNNI (most laptops since 2021), or AVX-512 VNNI's instruction on 8 lanes: as on 16 lanes above.
#if defined(__AVXVNNI__)
inline IVec dot4(IVec acc, IVec u, IVec a) { return _mm256_dpbusd_avx_epi32(acc, u, a); }
#else
inline IVec dot4(IVec acc, IVec u, IVec a) { return _mm256_dpbusd_epi32(acc, u, a); }
#endif
#else
// AVX2: as AVX-512 without VNNI.
inline IVec even_words(IVec u) { return _mm256_and_si256(u, _mm256_set1_epi16(0x00FF)); }
inline IVec odd_words(IVec u) { return _mm256_srli_epi16(u, 8); }
inline IVec madd_words(IVec a, IVec b) { return _mm256_madd_epi16(a, b); }
inline IVec iadd(IVec a, IVec b) { return _mm256_add_epi32(a, b); }
inline IVec dot4_small(IVec acc, IVec u, IVec a) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, a)); }
inline IVec small_sums(IVec acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
#endif
inline IVec centred(IVec sums, int32_t levels) { return _mm256_sub_epi32(sums, _mm256_set1_epi32(128 * levels)); }
inline IVec low_nibbles(IVec v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline IVec high_nibbles(IVec v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
#endif

// 8-bit weights' products (and with VNNI 4-bit ones), on either vector width. With VNNI the stored levels u
// and the activations' levels a go to vpdpbusd as they are. Without, vpmaddubsw's 16-bit pairs of bytes would
// saturate (2 * 255 * 127 > 32,767), so they multiply as 16-bit words: a lane's 4 bytes u0..u3 are the words
// u1:u0 and u3:u2; masked, the words u0 and u2, shifted, u1 and u3, each pair times the activations' words a0,
// a2 or a1, a3 (`Levels::wide`) and summed into 32 bits, exact.
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__)
constexpr bool kVnni = true;
inline IVec dot4_small(IVec acc, IVec u, IVec a) { return dot4(acc, u, a); }  // 4-bit levels as 8-bit ones
inline IVec small_sums(IVec acc) { return acc; }
using Weights8 = IVec;
struct Activations8 {
  IVec a;
};
inline Activations8 activations8(const int8_t* a, const int16_t*) { return {ibroadcast(four_bytes(a))}; }
inline Weights8 weights8(IVec u) { return u; }
inline IVec dot8(IVec acc, Weights8 u, const Activations8& x) { return dot4(acc, u, x.a); }
#else
constexpr bool kVnni = false;
struct Weights8 {
  IVec even, odd;
};
struct Activations8 {
  IVec even, odd;
};
inline Activations8 activations8(const int8_t*, const int16_t* wide) {
  return {ibroadcast(four_bytes(wide)), ibroadcast(four_bytes(wide + 2))};
}
inline Weights8 weights8(IVec u) { return {even_words(u), odd_words(u)}; }
inline IVec dot8(IVec acc, const Weights8& u, const Activations8& x) {
  return iadd(acc, iadd(madd_words(u.even, x.even), madd_words(u.odd, x.odd)));
}
#endif
// A forward of many rows reads each panel's weights once per block of rows: on AVX2, from kSplitRows rows,
// their words are made once a panel (`split_panels`) and read back, rather than masked and shifted again for
// every block: 0.94-0.96x the time at 256-512 rows (AMD EPYC steered, 2026-12-06). Fewer rows do not repay
// the words' stores: 1.03-1.4x the time at 5-32 rows, the same at 64. Not with AVX-512's 16 lanes and 3
// panels a block, whose words took 1.06x the time at 64 rows.
constexpr bool kSplitWeights = !kVnni && kLanes == 8;
constexpr int64_t kSplitRows = 128;

// The loops over a block's rows, panels and vectors are unrolled whole, so that its accumulators live in
// registers (GCC left them on the stack otherwise: AVX2 forwards of 8+ rows took twice as long).
#define UNROLL _Pragma("GCC unroll 16")
// Holds a block's sums in registers at this point (the end of a quad): GCC otherwise reassociates a group's
// integer sums across its 8 quads and keeps the products of all of them on the stack (AVX2 without VNNI: 135
// spills for 96 vpmaddubsw a group in a block of 6 rows).
template <typename T, int R, int P, int V>
inline void in_registers(T (&sums)[R][P][V]) {
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < V; ++h) asm volatile("" : "+v"(sums[r][p][h]));
}

// Inputs per scale and offset (a group), along k: 128 for int8 weights where the input size is a multiple
// of it, else 32, as 4-bit weights always take. A group's products are summed exactly in integers and
// scaled once, so wider groups scale less often: 0.78-0.84x the time of groups of 32 at 64-256 rows
// (docs/kernels.md); 16 levels over 128 inputs lost too much (a mean negative log-likelihood 3% higher).
constexpr int64_t kGroup = 32;
constexpr int64_t kWideGroup = 128;
constexpr int64_t kPanel = 16;            // outputs per panel
constexpr int kVectors = kPanel / kLanes;  // vectors per panel: 2 (AVX2) or 1 (AVX-512)
constexpr int kDirectRows = 4;            // forwards of up to this many rows stream the weights once
// `body.template operator()<n>()` for the run-time count n in 1..N: a block's rows or panels as a template
// argument, so that its loops unroll whole.
template <int N, typename Body>
void by_count(int n, const Body& body) {
  if constexpr (N > 1) {
    if (n < N) return by_count<N - 1>(n, body);
  }
  body.template operator()<N>();
}

// ---- int8 and int4 weights (q8_linear, q4_linear) ----

constexpr int64_t kQuad = 4;                     // inputs a lane sums per instruction
constexpr int64_t kQuadBytes = kPanel * kQuad;   // a panel's weights for 4 inputs (8 at 4 bits): 64 bytes
template <int Bits>
constexpr int64_t kBlockInputs = Bits == 4 ? 2 * kQuad : kQuad;  // inputs a lane's 4 bytes hold
inline int64_t block_inputs(int64_t bits) { return bits == 4 ? kBlockInputs<4> : kBlockInputs<8>; }
// 5-bit levels (0..31, a byte each, laid out as 8-bit ones) without VNNI: vpmaddubsw pairs them with the
// activations' levels into 16-bit lanes, which hold half a group's (4 quads: 8 products of at most 31 * 127,
// 31,496 at most) exactly before they are widened to 32 bits: the layers 0.71-0.77x int8's time at 8-256 rows
// on AVX2, a whole forward 0.87-0.92x (the weights' bytes the same, a multiply-add where int8 takes two;
// docs/kernels.md).
constexpr int kHalfGroupQuads = 4;
// 16 vector registers where AVX-512's encoding is not compiled in (AVX2, and AVX-VNNI: most Intel laptops
// since 2021), 32 where it is (16 lanes, or 8 with AVX-512 VL: SPECEDIT_256). The sums, the weights and the
// activations in flight must fit them: a block that spills its sums to the stack takes up to 1.5x the time.
#if defined(__AVX512F__)
constexpr bool kFewRegisters = false;
#else
constexpr bool kFewRegisters = true;
#endif
// The register block for forwards of many rows: 6 rows by 16 outputs (8 lanes) or 48 (16 lanes), the
// fastest of 2-8 rows by 16-64 outputs for the 0.5B model's layers (2026-12, Intel Xeon, 2 threads); with
// 16 registers 4 rows, whose sums take 2 registers a row: on AVX2 4 rows took 0.89x 6 rows' time and 0.92x
// 5 rows' at 256 rows, about the same at 64 (AMD EPYC steered to AVX2, 2026-12-04); with AVX-VNNI 4 rows
// took 0.65-0.73x 6 rows' at 64-256 rows (int8), and 3 rows 0.67-0.73x at int4, whose 4-bit blocks
// broadcast two sets of activations a row (AMD EPYC with AVX-512's upper 16 registers kept from the
// compiler, -ffixed-xmm16..31, as AVX-VNNI has none; 2026-12-06). AMD's cores take 4 rows on 16 lanes
// (`int_rows`).
// 5-bit levels without VNNI hold a 16-bit sum beside each 32-bit one: 3 rows (`int_block`).
template <int Bits>
constexpr int kIntRows = !kFewRegisters ? 6 : ((kVnni && Bits == 4) || (!kVnni && Bits == 5) ? 3 : 4);
constexpr int kIntPanels = kVectors == 2 ? 1 : 3;

// Rows a block of a many-row forward takes on this CPU: kIntRows, but 4 on AMD's cores with 16 lanes and
// VNNI, where 6 rows' 18 sums and 18 accumulators do not fit 32 registers, and each 64-byte register that
// goes through memory takes two of the core's 32-byte loads and stores (Zen 4 splits them): 4 rows by 48
// outputs took 0.87-0.90x the time of 6 at 64-512 rows at int8 and 0.91-0.93x at int4 (AMD EPYC,
// AVX512-BF16, the 0.5B model's 24 layers streamed, 2 threads, 2026-12-06). On the Intel Xeon 6 rows were
// the fastest (above). Every block computes each output alike: the same bits.
template <int Bits>
int int_rows() {
  if constexpr (kVectors == 1 && kVnni) {
    constexpr int kAmdRows = 4;
    static_assert(kAmdRows <= kIntRows<Bits>, "a block is at most kIntRows (int_panels' by_count)");
    static const bool amd = (__builtin_cpu_init(), __builtin_cpu_is("amd"));
    if (amd) return kAmdRows;
  }
  return kIntRows<Bits>;
}

// Panels a block of R rows of a few-row forward takes at a time: 4, or with 16 registers 4 for one row and 1
// for more, whose sums then fit beside the weights' (2 rows on 1 panel rather than 2: 0.80x the time at
// int4, 0.90x at int8 on AVX2, the 0.5B model's 24 layers streamed from memory, 2026-12-04; with AVX-VNNI
// 4 rows 0.71x at int8 and 0.84x at int4, 3 rows 0.90x and 0.79x, 2026-12-06, as above).
template <int R>
constexpr int kDirectPanels = kFewRegisters ? (R == 1 ? 4 : 1) : 4;

struct IntWeights {
  const uint8_t* q;         // (panels, K/4, 64): panel p's outputs n at inputs 4j..4j+3: bytes 4n..4n+3 of quad j
                            // (4 bits: (panels, K/8, 64), inputs 8j..8j+3 in the low nibbles, 8j+4..8j+7 high)
  const at::Half* scales;   // (panels, K/G, 16): G inputs a group
  const at::Half* offsets;  // (panels, K/G, 16)
  const float* bias;        // (N) or null
  int64_t K;
};

// A forward's activations quantized (`quantize_row`) in the weights' groups of G, row r's at r * K and r * K/G.
struct Levels {
  const int8_t* a;        // (M, K): round(x * 127 / max|x|), in -127..127
  const float* step;      // (M, K/G): d = max|x| / 127 of the group (0 for a group of zeros)
  const float* total;     // (M, K/G): d * (sum of the group's levels)
  const int32_t* sum;     // (M, K/G): the sum of the group's levels
  // (M, K): the levels as 16-bit words, each 4 inputs' as a0, a2, a1, a3 (8-bit weights without VNNI), or null
  const int16_t* wide;
  int64_t K;
};

// The activations' highest level: int8's 127. From 2026-12-04 to 12-06 it was 63, so that AVX2 without VNNI
// could pair the weights' stored bytes by vpmaddubsw (2 * 255 * 63 fits 16 bits); over groups of 128 inputs
// that doubled the 0.5B model's distance from its float32 weights' outputs. Without VNNI 8-bit levels now
// multiply as 16-bit words: 1.2-1.35x the time at 16-512 rows, the same at one (docs/kernels.md).
constexpr float kActivationTop = 127.0f;

// Row x (K floats) quantized into its levels, per group of G: d = max|x| / 127, a = round(x * (127 /
// max|x|)), to even; a group of zeros has d = 0 and levels 0. Elementwise, so every vector width agrees.
// `wide` (8-bit weights without VNNI; else null): the levels again as `Levels::wide` has them.
template <int64_t G>
void quantize_row(const float* x, int64_t K, int8_t* a, float* step, float* total, int32_t* sum, int16_t* wide) {
  for (int64_t g = 0; g < K / G; ++g) {
    const float* xs = x + g * G;
    Vec high = zero();
    UNROLL for (int i = 0; i < G; i += kLanes) high = greater(high, magnitude(load(xs + i)));
    const float largest = greatest(high);
    const float inverse = largest > 0.0f ? kActivationTop / largest : 0.0f;
    const Vec scale = broadcast(&inverse);
    UNROLL for (int i = 0; i < G; i += kLanes) store_int8(a + g * G + i, rounded(mul(load(xs + i), scale)));
    int32_t levels = 0;
    for (int i = 0; i < G; ++i) levels += a[g * G + i];
    step[g] = largest / kActivationTop;
    sum[g] = levels;
    total[g] = step[g] * static_cast<float>(levels);
  }
  if (wide != nullptr) {  // `Levels::wide`
    for (int64_t k = 0; k < K; k += kQuad) {
      wide[k] = a[k];
      wide[k + 1] = a[k + 2];
      wide[k + 2] = a[k + 1];
      wide[k + 3] = a[k + 3];
    }
  }
}

// R rows (from `row`) by P panels (from `panel`): per group, the exact integer sums of the G products,
// then the group's two fused multiply-adds per output (see the top of this file).
// `Split`: panels [panel, panel + P)'s 8-bit weights read from `split` as `split_panels` made them.
template <int R, int P, int Bits, int64_t G, bool Split = false>
void int_block(const Levels& x, int64_t row, const IntWeights& w, int64_t panel, float* out, int64_t N,
               const Weights8* split = nullptr) {
  static_assert(Bits == 8 || G == kGroup, "4- and 5-bit levels without VNNI sum in 16-bit lanes: groups of 32");
  const int64_t K = w.K, groups = K / G, quads = K / kQuad, octets = K / kBlockInputs<4>;
  Vec acc[R][P][kVectors];
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < kVectors; ++h) acc[r][p][h] = zero();
  for (int64_t g = 0; g < groups; ++g) {
    IVec sums[R][P][kVectors];
    UNROLL for (int r = 0; r < R; ++r)
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) sums[r][p][h] = izero();
    if constexpr (Bits == 8 || (Bits == 5 && kVnni)) {  // (5-bit levels with VNNI: as 8-bit ones, uncentred)
      UNROLL for (int j = 0; j < G / kQuad; ++j) {
        const int64_t quad = g * (G / kQuad) + j;
        const auto activations = [&](int r) {
          const int64_t at = (row + r) * K + quad * kQuad;
          return activations8(x.a + at, kVnni ? nullptr : x.wide + at);  // (no words with VNNI: may be null)
        };
        const auto weights = [&](int p, int h) {
          if constexpr (Split)
            return split[(p * quads + quad) * kVectors + h];
          else
            return weights8(iload(w.q + ((panel + p) * quads + quad) * kQuadBytes + h * kLanes * kQuad));
        };
        if constexpr (kVnni || R == 1) {  // each row's activations held, the weights read one vector at a time
          Activations8 a[R];
          UNROLL for (int r = 0; r < R; ++r) a[r] = activations(r);
          UNROLL for (int p = 0; p < P; ++p)
            UNROLL for (int h = 0; h < kVectors; ++h) {
              const Weights8 u = weights(p, h);
              UNROLL for (int r = 0; r < R; ++r) sums[r][p][h] = dot8(sums[r][p][h], u, a[r]);
            }
        } else {  // without VNNI a row's activations and a vector of weights take 2 registers each: the
                  // weights held, a row at a time
          Weights8 u[P][kVectors];
          UNROLL for (int p = 0; p < P; ++p)
            UNROLL for (int h = 0; h < kVectors; ++h) u[p][h] = weights(p, h);
          UNROLL for (int r = 0; r < R; ++r) {
            const Activations8 a = activations(r);
            UNROLL for (int p = 0; p < P; ++p)
              UNROLL for (int h = 0; h < kVectors; ++h) sums[r][p][h] = dot8(sums[r][p][h], u[p][h], a);
          }
        }
        in_registers(sums);
      }
    } else if constexpr (Bits == 5) {  // without VNNI: vpmaddubsw, half a group in 16-bit lanes, then widened
      UNROLL for (int half = 0; half < 2; ++half) {
        IVec small[R][P][kVectors];
        UNROLL for (int r = 0; r < R; ++r)
          UNROLL for (int p = 0; p < P; ++p)
            UNROLL for (int h = 0; h < kVectors; ++h) small[r][p][h] = izero();
        UNROLL for (int j = 0; j < kHalfGroupQuads; ++j) {
          const int64_t quad = g * (G / kQuad) + half * kHalfGroupQuads + j;
          IVec a[R];
          UNROLL for (int r = 0; r < R; ++r) a[r] = ibroadcast(four_bytes(x.a + (row + r) * K + quad * kQuad));
          UNROLL for (int p = 0; p < P; ++p)
            UNROLL for (int h = 0; h < kVectors; ++h) {
              const IVec u = iload(w.q + ((panel + p) * quads + quad) * kQuadBytes + h * kLanes * kQuad);
              UNROLL for (int r = 0; r < R; ++r) small[r][p][h] = dot4_small(small[r][p][h], u, a[r]);
            }
          in_registers(small);
        }
        UNROLL for (int r = 0; r < R; ++r)
          UNROLL for (int p = 0; p < P; ++p)
            UNROLL for (int h = 0; h < kVectors; ++h)
              sums[r][p][h] = iadd(sums[r][p][h], small_sums(small[r][p][h]));
        in_registers(sums);
      }
    } else {  // 4 bits: a 64-byte block holds 8 inputs of each lane, 4 in the low nibbles, 4 in the high
      UNROLL for (int j = 0; j < G / kBlockInputs<4>; ++j) {
        const int64_t octet = g * (G / kBlockInputs<4>) + j;
        IVec low[R], high[R];
        UNROLL for (int r = 0; r < R; ++r) {
          low[r] = ibroadcast(four_bytes(x.a + (row + r) * K + octet * kBlockInputs<4>));
          high[r] = ibroadcast(four_bytes(x.a + (row + r) * K + octet * kBlockInputs<4> + kQuad));
        }
        UNROLL for (int p = 0; p < P; ++p)
          UNROLL for (int h = 0; h < kVectors; ++h) {
            const IVec packed = iload(w.q + ((panel + p) * octets + octet) * kQuadBytes + h * kLanes * kQuad);
            const IVec first = low_nibbles(packed), second = high_nibbles(packed);
            UNROLL for (int r = 0; r < R; ++r) {
              sums[r][p][h] = dot4_small(sums[r][p][h], first, low[r]);
              sums[r][p][h] = dot4_small(sums[r][p][h], second, high[r]);
            }
          }
        in_registers(sums);
      }
    }
    // Each row widens the panel's float16 scales and offsets again: widening them once for all R rows held
    // them in registers the block lacks (1.06-1.08x the time at 64 rows with VNNI, docs/kernels.md).
    UNROLL for (int r = 0; r < R; ++r) {
      const int64_t at = (row + r) * groups + g;
      const Vec step = broadcast(x.step + at), total = broadcast(x.total + at);
      UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int h = 0; h < kVectors; ++h) {
          const int64_t group = ((panel + p) * groups + g) * kPanel + h * kLanes;
          const IVec exact = Bits == 8   ? centred(sums[r][p][h], x.sum[at])
                             : Bits == 5 ? sums[r][p][h]
                                         : small_sums(sums[r][p][h]);
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

// Panels [panel, panel + P)'s 8-bit weights as `weights8` makes them, in `split` (P, K/4, kVectors): once for
// all the row blocks of a many-row forward.
void split_panels(const IntWeights& w, int64_t panel, int P, std::vector<Weights8>& split) {
  const int64_t quads = w.K / kQuad;
  split.resize(P * quads * kVectors);
  for (int64_t i = 0; i < P * quads * kVectors; ++i)
    split[i] = weights8(iload(w.q + panel * quads * kQuadBytes + i * kLanes * kQuad));
}

// Panels [first, last) for a forward of M rows: up to 4 rows, 4 panels at a time as the weights stream by
// (each weight read once); more, kIntPanels at a time (in the cache), the rows in blocks of `int_rows`.
template <int Bits, int64_t G>
void int_panels(const Levels& x, int64_t M, const IntWeights& w, int64_t first, int64_t last, float* out,
                 int64_t N) {
  if (M <= kDirectRows) {
    return by_count<kDirectRows>(static_cast<int>(M), [&]<int R>() {
      int64_t panel = first;
      constexpr int P = kDirectPanels<R>;
      for (; panel + P <= last; panel += P) int_block<R, P, Bits, G>(x, 0, w, panel, out, N);
      for (; panel < last; ++panel) int_block<R, 1, Bits, G>(x, 0, w, panel, out, N);
    });
  }
  const int rows = int_rows<Bits>();
  thread_local std::vector<Weights8> split;  // kept between calls: no new pages to touch
  // A block of one row (a forward's last, when M is 1 more than a multiple of 4) makes its words itself:
  // read back from `split`, 5 rows took 2-3x the time (AMD EPYC steered, 2026-12-06).
  const auto blocks = [&]<bool Split>(int64_t panel, bool whole) {
    if constexpr (Split) split_panels(w, panel, whole ? kIntPanels : 1, split);
    for (int64_t m = 0; m < M; m += rows) {
      by_count<kIntRows<Bits>>(static_cast<int>(std::min<int64_t>(rows, M - m)), [&]<int R>() {
        if (whole)
          int_block<R, kIntPanels, Bits, G, (Split && R > 1)>(x, m, w, panel, out, N, split.data());
        else
          int_block<R, 1, Bits, G, (Split && R > 1)>(x, m, w, panel, out, N, split.data());
      });
    }
  };
  constexpr bool kMaySplit = Bits == 8 && kSplitWeights;  // (else no split variant is compiled)
  for (int64_t panel = first; panel < last;) {
    const bool whole = panel + kIntPanels <= last;
    if (kMaySplit && M >= kSplitRows)
      blocks.template operator()<kMaySplit>(panel, whole);
    else
      blocks.template operator()<false>(panel, whole);
    panel += whole ? kIntPanels : 1;
  }
}

// A forward's rows quantized in groups of G (`quantize_row`), the tensors `Levels` points into, kept in `kept`;
// `words`: the levels as 16-bit words too (`Levels::wide`), which 8-bit weights without VNNI read.
template <int64_t G>
Levels quantized_rows(const at::Tensor& x, bool words, std::vector<at::Tensor>& kept) {
  const int64_t M = x.size(0), K = x.size(1), groups = K / G;
  kept.push_back(at::empty({M, K}, x.options().dtype(at::kChar)));
  int8_t* ap = kept.back().data_ptr<int8_t>();
  kept.push_back(at::empty({3, M, groups}, x.options()));  // step, total, and the sums as int32 bits
  float* sp = kept.back().data_ptr<float>();
  int32_t* sums = reinterpret_cast<int32_t*>(sp + 2 * M * groups);
  int16_t* wp = nullptr;
  if (words && !kVnni) {
    kept.push_back(at::empty({M, K}, x.options().dtype(at::kShort)));
    wp = kept.back().data_ptr<int16_t>();
  }
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      quantize_row<G>(xp + r * K, K, ap + r * K, sp + r * groups, sp + (M + r) * groups, sums + r * groups,
                      wp != nullptr ? wp + r * K : nullptr);
  });
  return Levels{ap, sp, sp + M * groups, sums, wp, K};
}

// x @ W^T + bias for each of several layers that read the same input (a layer's q, k and v projections, its
// gate and up), each on integer weights of its own width, `bits` (8, 5 or 4: q8_linear, q5_linear,
// q4_linear): the checks, the activations quantized once per row for each group size the layers take (32,
// or 128 at 8 bits, read off their scales, (N/16, K/G, 16)), then the panels of every layer split among the
// threads in one go. A layer's outputs are what a call of its own computes (a list of one), bit for bit.
std::vector<at::Tensor> int_linears(const char* name, const at::Tensor& input, at::TensorList qs,
                                    at::TensorList scales, at::TensorList offsets,
                                    const c10::List<c10::optional<at::Tensor>>& biases, c10::IntArrayRef bits) {
  const size_t layers = qs.size();
  TORCH_CHECK(layers > 0 && scales.size() == layers && offsets.size() == layers && biases.size() == layers &&
                  bits.size() == layers,
              name, ": as many scales, offsets, biases and widths as weights");
  TORCH_CHECK(input.scalar_type() == at::kFloat, name, ": float32 activations");
  const int64_t K = input.size(-1);
  TORCH_CHECK(K % kGroup == 0, name, ": the input size must be a multiple of 32");
  std::vector<IntWeights> weights;
  std::vector<int64_t> group;                 // layer i's inputs a scale and offset
  std::vector<at::Tensor> kept_biases;        // contiguous copies, alive while the kernels read them
  std::vector<int64_t> first_panel{0};         // layer i's panels are [first_panel[i], first_panel[i + 1])
  // which group sizes the layers take, and whether 8-bit ones in groups of 32 need the levels as words
  bool by_128 = false, by_32 = false, words_by_32 = false;
  for (size_t i = 0; i < layers; ++i) {
    const at::Tensor &q = qs[i], &s = scales[i], &o = offsets[i];
    const int64_t b = bits[i];
    TORCH_CHECK(b == 8 || b == 5 || b == 4, name, ": 8-, 5- or 4-bit weights, not ", b);
    const int64_t groups = s.dim() == 3 ? s.size(1) : 0, G = groups > 0 ? K / groups : 0;
    TORCH_CHECK(G * groups == K && (G == kGroup || (b == 8 && G == kWideGroup)), name,
                ": scales and offsets packed as (N/16, K/32, 16)", b == 8 ? " or (N/16, K/128, 16)" : "");
    TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 3 && q.size(2) == kQuadBytes && q.is_contiguous(), name,
                ": uint8 weights packed as (N/16, K/", block_inputs(b), ", 64)");
    TORCH_CHECK(q.size(1) * block_inputs(b) == K, name, ": the input has ", K, " features, the weights ",
                q.size(1) * block_inputs(b));
    const int64_t N = q.size(0) * kPanel;
    for (const at::Tensor* t : {&s, &o})
      TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->dim() == 3 && t->size(1) == groups &&
                      t->numel() == N * groups,
                  name, ": float16 scales and offsets packed as (N/16, K/", G, ", 16)");
    IntWeights w{q.data_ptr<uint8_t>(), s.data_ptr<at::Half>(), o.data_ptr<at::Half>(), nullptr, K};
    const c10::optional<at::Tensor> bias = biases.get(i);
    if (bias.has_value() && bias->defined()) {
      kept_biases.push_back(bias->contiguous());
      TORCH_CHECK(kept_biases.back().scalar_type() == at::kFloat && kept_biases.back().numel() == N, name,
                  ": a float32 bias of N");
      w.bias = kept_biases.back().data_ptr<float>();
    }
    weights.push_back(w);
    group.push_back(G);
    (G == kWideGroup ? by_128 : by_32) = true;
    words_by_32 = words_by_32 || (b == 8 && G == kGroup);
    first_panel.push_back(first_panel.back() + q.size(0));
  }
  const at::Tensor x = input.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<at::Tensor> outs;
  std::vector<float*> out_data;
  for (size_t i = 0; i < layers; ++i) {
    std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
    shape.back() = (first_panel[i + 1] - first_panel[i]) * kPanel;
    outs.push_back(at::empty(shape, input.options()));
    out_data.push_back(outs.back().data_ptr<float>());
  }
  if (M == 0) return outs;
  std::vector<at::Tensor> kept;  // the levels' tensors, alive while the kernels read them
  const Levels in_128s = by_128 ? quantized_rows<kWideGroup>(x, true, kept) : Levels{};  // (all 8-bit)
  const Levels in_32s = by_32 ? quantized_rows<kGroup>(x, words_by_32, kept) : Levels{};
  // A chunk of panels per thread, across the layers; grains of 8 keep the few-row kernel's blocks of panels
  // whole.
  at::parallel_for(0, first_panel.back(), 8, [&](int64_t first, int64_t last) {
    for (size_t i = 0; i < layers; ++i) {
      const int64_t from = std::max(first, first_panel[i]) - first_panel[i];
      const int64_t to = std::min(last, first_panel[i + 1]) - first_panel[i];
      if (from >= to) continue;
      const int64_t N = (first_panel[i + 1] - first_panel[i]) * kPanel;
      if (group[i] == kWideGroup)
        int_panels<8, kWideGroup>(in_128s, M, weights[i], from, to, out_data[i], N);
      else if (bits[i] == 8)
        int_panels<8, kGroup>(in_32s, M, weights[i], from, to, out_data[i], N);
      else if (bits[i] == 5)
        int_panels<5, kGroup>(in_32s, M, weights[i], from, to, out_data[i], N);
      else
        int_panels<4, kGroup>(in_32s, M, weights[i], from, to, out_data[i], N);
    }
  });
  return outs;
}

at::Tensor int_linear(const char* name, int64_t bits, const at::Tensor& input, const at::Tensor& q,
                      const at::Tensor& scales, const at::Tensor& offsets, const c10::optional<at::Tensor>& bias) {
  return int_linears(name, input, {q}, {scales}, {offsets}, c10::List<c10::optional<at::Tensor>>({bias}), {bits})[0];
}

at::Tensor q8_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias) {
  return int_linear("q8_linear", 8, input, q, scales, offsets, bias);
}

at::Tensor q5_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias) {
  return int_linear("q5_linear", 5, input, q, scales, offsets, bias);
}

at::Tensor q4_linear(const at::Tensor& input, const at::Tensor& q, const at::Tensor& scales,
                     const at::Tensor& offsets, const c10::optional<at::Tensor>& bias) {
  return int_linear("q4_linear", 4, input, q, scales, offsets, bias);
}

std::vector<at::Tensor> linears(const at::Tensor& input, at::TensorList q, at::TensorList scales,
                                at::TensorList offsets, const c10::List<c10::optional<at::Tensor>>& bias,
                                c10::IntArrayRef bits) {
  return int_linears("linears", input, q, scales, offsets, bias, bits);
}

// ---- attention ----

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

constexpr int64_t kQueryBlock = 64;  // queries a task scores together: each key is read once for all of them

// Element: the keys' and values' type, float or at::Half (widened to float32 as read: exactly).
template <typename Element>
struct AttentionArgs {
  const float* q;    // (H, T, D), strides q_head, q_row; d contiguous
  const Element* k;  // (H_kv, >= first + T, D), strides k_head, k_row
  const Element* v;  // as k
  int64_t q_head, q_row, k_head, k_row, v_head, v_row;
  float* out;  // (T, H, D)
  int64_t heads, kv_heads, rows, D, first;
  float scale;
};

// The weighted values run as a product of the block's e (queries by keys) and the values (keys by D), in
// tiles of kValueQueries queries by kValueVectors vectors of outputs, a key chunk at a time: the chunk's values
// and e stay in the cache while every tile reads them (a query at a time over all keys read the values once
// a query, from memory past a few thousand keys: half of a 64-row forward of the 1.5B model at 3,000
// positions steered to AVX2).
constexpr int kValueQueries = 6;
constexpr int kValueVectors = kLanes == 16 ? 4 : 2;  // 24 or 12 registers of sums
constexpr int64_t kValueKeys = 256;                  // a chunk: its values and e within a core's L2

// C vectors of the sums of Q queries (lanes l .. l + Q - 1 of the block), from output d, over keys [begin,
// end) up to each one's last: its sums read from out (zero at key 0), one chain of multiply-adds over those
// keys in order, of its e of the key (e[key * stride + q]) times the key's values, and stored back there.
// Chunk by chunk, a query's chain runs over its keys in their order, whatever the queries beside it.
template <int C, int Q, typename Element>
void weighted_values(const AttentionArgs<Element>& a, int64_t g, const int64_t* last, const float* e, int64_t stride,
                     int64_t d, float* const* out, int64_t begin, int64_t end) {
  const Element* values = a.v + g * a.v_head + d;
  Vec acc[Q][C];
  UNROLL for (int q = 0; q < Q; ++q)
    UNROLL for (int c = 0; c < C; ++c) acc[q][c] = begin == 0 ? zero() : load(out[q] + c * kLanes);
  int64_t together = end - 1;
  UNROLL for (int q = 0; q < Q; ++q) together = std::min(together, last[q]);
  for (int64_t j = begin; j <= together; ++j) {
    Vec value[C];
    UNROLL for (int c = 0; c < C; ++c) value[c] = load(values + j * a.v_row + c * kLanes);
    UNROLL for (int q = 0; q < Q; ++q) {
      const Vec weight = broadcast(e + j * stride + q);
      UNROLL for (int c = 0; c < C; ++c) acc[q][c] = madd(weight, value[c], acc[q][c]);
    }
  }
  UNROLL for (int q = 0; q < Q; ++q) {
    const int64_t until = std::min(end - 1, last[q]);
    for (int64_t j = std::max(begin, together + 1); j <= until; ++j) {
      const Vec weight = broadcast(e + j * stride + q);
      UNROLL for (int c = 0; c < C; ++c) acc[q][c] = madd(weight, load(values + j * a.v_row + c * kLanes), acc[q][c]);
    }
    UNROLL for (int c = 0; c < C; ++c) store(out[q] + c * kLanes, acc[q][c]);
  }
}

// The block's outputs (count queries, lanes 0 .. count - 1, query l's at out[l], keys up to last[l]): the
// weighted values tile by tile and chunk by chunk, then each divided by its sum.
template <typename Element>
void block_outputs(const AttentionArgs<Element>& a, int64_t g, int64_t count, int64_t keys, const int64_t* last,
                   const float* e, int64_t stride, const float* sums, float* const* out) {
  for (int64_t begin = 0; begin < keys; begin += kValueKeys) {
    const int64_t end = std::min(keys, begin + kValueKeys);
    for (int64_t d = 0; d < a.D;) {
      const int vectors = static_cast<int>(std::min<int64_t>(kValueVectors, (a.D - d) / kLanes));
      float* outputs[kQueryBlock];
      for (int64_t l = 0; l < count; ++l) outputs[l] = out[l] + d;
      by_count<kValueVectors>(vectors, [&]<int C>() {
        for (int64_t l = 0; l < count; l += kValueQueries) {
          by_count<kValueQueries>(static_cast<int>(std::min<int64_t>(kValueQueries, count - l)), [&]<int Q>() {
            weighted_values<C, Q>(a, g, last + l, e + l, stride, d, outputs + l, begin, end);
          });
        }
      });
      d += vectors * kLanes;
    }
  }
  for (int64_t l = 0; l < count; ++l)
    for (int64_t d = 0; d < a.D; d += kLanes) store(out[l] + d, divide(load(out[l] + d), splat(sums[l])));
}

// Keys j .. j + U - 1 (their rows from k on, `stride` apart, D wide) scored against W vectors of queries (qt:
// (D, lanes) transposed, rows L apart): per key and query one chain of multiply-adds over d in order, times the
// scale; a key past a query's position (`until`) scores -infinity there. Each query's largest score kept, the
// scores stored at scores[key * L + lane]. Each key's width is read once for W vectors, each query vector's
// once for U keys.
template <int W, int U>
void score_keys(const float* k, int64_t j, int64_t stride, int64_t D, const float* qt, int64_t L, const Vec* until,
                Vec* largest, float* scores, float scale) {
  Vec acc[U][W];
  UNROLL for (int u = 0; u < U; ++u)
    UNROLL for (int w = 0; w < W; ++w) acc[u][w] = zero();
  for (int64_t d = 0; d < D; ++d) {
    Vec q[W];
    UNROLL for (int w = 0; w < W; ++w) q[w] = load(qt + d * L + w * kLanes);
    UNROLL for (int u = 0; u < U; ++u) {
      const Vec kd = broadcast(k + u * stride + d);
      UNROLL for (int w = 0; w < W; ++w) acc[u][w] = madd(kd, q[w], acc[u][w]);
    }
  }
  UNROLL for (int u = 0; u < U; ++u) {
    const Vec index = splat(static_cast<float>(j + u));
    UNROLL for (int w = 0; w < W; ++w) {
      const Vec score = kept_if_at_most(index, until[w], mul(acc[u][w], splat(scale)),
                                        splat(-std::numeric_limits<float>::infinity()));
      largest[w] = greater(largest[w], score);
      store(scores + (j + u) * L + w * kLanes, score);
    }
  }
}

// The scores' register tile: kScoreVectors vectors of queries by 6 keys (8 keys for one vector): 12 or 24
// chains of multiply-adds in flight, a load of a query vector for every 6 of them (for every 1 when all 8
// vectors of a block took one key at a time: AVX2 then waited on the loads).
constexpr int kScoreVectors = kLanes == 16 ? 4 : 2;

// Queries [start, start + count) of kv head g's group (query i: head g * G + i / T, row i % T, at position
// first + i % T), one a lane of V vectors: the scores of every key up to the block's last position, each one
// chain of multiply-adds over d in order; per query, the largest score of the keys at or before its position,
// e = exp(score - largest) of those (0 for the others) and their sum in the order of the keys; then its output,
// one chain of multiply-adds over those keys in order per d, of e times the key's value, divided by that sum.
// A query's arithmetic never involves another query: which block, lane or thread computes it changes nothing.
template <int V, typename Element>
void attention_block(const AttentionArgs<Element>& a, int64_t g, int64_t start, int64_t count, std::vector<float>& qt,
                     std::vector<float>& scores, std::vector<float>& widened) {
  constexpr int64_t L = V * kLanes;
  const int64_t G = a.heads / a.kv_heads, D = a.D;
  int64_t head[L], row[L];
  float position[L];
  int64_t keys = 0;
  qt.resize(D * L);  // every lane written below
  for (int64_t l = 0; l < L; ++l) {
    const int64_t i = start + std::min(l, count - 1);  // lanes past the block repeat its last query
    head[l] = g * G + i / a.rows;
    row[l] = i % a.rows;
    position[l] = static_cast<float>(a.first + row[l]);
    keys = std::max(keys, a.first + row[l] + 1);
    const float* query = a.q + head[l] * a.q_head + row[l] * a.q_row;
    for (int64_t d = 0; d < D; ++d) qt[d * L + l] = query[d];
  }
  scores.resize(keys * L);
  Vec until[V], largest[V], total[V];  // a lane's last key, largest score, sum
  UNROLL for (int v = 0; v < V; ++v) {
    until[v] = load(position + v * kLanes);
    largest[v] = splat(-std::numeric_limits<float>::infinity());
    total[v] = zero();
  }
  constexpr int W = std::min(V, kScoreVectors), U = W == 1 ? 8 : 6;
  const Element* k = a.k + g * a.k_head;
  if constexpr (!std::is_same_v<Element, float>) widened.resize(U * D);
  const auto score = [&]<int Keys>(int64_t j) {  // keys j .. j + Keys - 1, W vectors of queries at a time
    const float* rows = nullptr;
    int64_t stride = D;
    if constexpr (std::is_same_v<Element, float>) {
      rows = k + j * a.k_row, stride = a.k_row;
    } else {  // float16 keys widened into a scratch row block first: one conversion a vector, not a scalar
      UNROLL for (int u = 0; u < Keys; ++u)
        for (int64_t d = 0; d < D; d += kLanes) store(widened.data() + u * D + d, load(k + (j + u) * a.k_row + d));
      rows = widened.data();
    }
    for (int v = 0; v < V; v += W)
      by_count<W>(std::min(W, V - v), [&]<int Vectors>() {
        score_keys<Vectors, Keys>(rows, j, stride, D, qt.data() + v * kLanes, L, until + v, largest + v,
                                  scores.data() + v * kLanes, a.scale);
      });
  };
  int64_t scored = 0;
  for (; scored + U <= keys; scored += U) score.template operator()<U>(scored);
  for (; scored < keys; ++scored) score.template operator()<1>(scored);
  for (int64_t j = 0; j < keys; ++j) {
    const Vec index = splat(static_cast<float>(j));
    UNROLL for (int v = 0; v < V; ++v) {
      float* score = scores.data() + j * L + v * kLanes;
      const Vec e = kept_if_at_most(index, until[v], exp_nonpositive(subtract(load(score), largest[v])), zero());
      total[v] = add(total[v], e);
      store(score, e);
    }
  }
  float sums[L];
  UNROLL for (int v = 0; v < V; ++v) store(sums + v * kLanes, total[v]);
  int64_t last[L];
  float* out[L];
  for (int64_t l = 0; l < count; ++l) {
    last[l] = a.first + row[l];
    out[l] = a.out + (row[l] * a.heads + head[l]) * D;
  }
  block_outputs(a, g, count, keys, last, scores.data(), L, sums, out);
}

// Every kv head's queries in blocks of up to kQueryBlock, a task each, spread over the threads.
template <typename Element>
void attention_blocks(const AttentionArgs<Element>& a, int64_t group) {
  const int64_t blocks = (group + kQueryBlock - 1) / kQueryBlock;
  at::parallel_for(0, a.kv_heads * blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> qt, scores, widened;  // kept between calls: no new pages to touch
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / blocks, start = (task % blocks) * kQueryBlock;
      const int64_t count = std::min(kQueryBlock, group - start);
      by_count<kQueryBlock / kLanes>(static_cast<int>((count + kLanes - 1) / kLanes), [&]<int V>() {
        attention_block<V>(a, g, start, count, qt, scores, widened);
      });
    }
  });
}

// Causal attention of one sequence's queries at positions first .. first + T - 1 (query (H, T, D), keys and
// values (H_kv, >= first + T, D), any strides but d's, H a multiple of H_kv: grouped-query heads, head h
// on kv head h / (H / H_kv)) -> (T, H, D). D a multiple of 16. Blocks of up to kQueryBlock queries a task.
// The queries float32; the keys and values float32, or float16 (a cache of half the bytes to read), both alike.
at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t first,
                     double scale) {
  TORCH_CHECK(key.scalar_type() == value.scalar_type() &&
                  (key.scalar_type() == at::kFloat || key.scalar_type() == at::kHalf),
              "attention: keys and values both float32 or both float16");
  for (const at::Tensor* t : {&query, &key, &value})
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1, "attention: (heads, positions, D) with D contiguous");
  TORCH_CHECK(query.scalar_type() == at::kFloat, "attention: float32 queries");
  const int64_t H = query.size(0), T = query.size(1), D = query.size(2), H_kv = key.size(0);
  TORCH_CHECK(D % 16 == 0 && key.size(2) == D && value.size(2) == D, "attention: D a multiple of 16, alike");
  TORCH_CHECK(H_kv > 0 && H % H_kv == 0 && value.size(0) == H_kv, "attention: heads a multiple of kv heads");
  TORCH_CHECK(first >= 0 && key.size(1) >= first + T && value.size(1) >= first + T,
              "attention: keys and values for every position up to the last query's");
  at::Tensor out = at::empty({T, H, D}, query.options());
  if (T == 0) return out;
  const auto run = [&]<typename Element>(const Element* k, const Element* v) {
    const AttentionArgs<Element> a{query.data_ptr<float>(), k, v, query.stride(0), query.stride(1), key.stride(0),
                                   key.stride(1), value.stride(0), value.stride(1), out.data_ptr<float>(), H, H_kv,
                                   T, D, first, static_cast<float>(scale)};
    attention_blocks(a, (H / H_kv) * T);
  };
  if (key.scalar_type() == at::kHalf)
    run(key.data_ptr<at::Half>(), value.data_ptr<at::Half>());
  else
    run(key.data_ptr<float>(), value.data_ptr<float>());
  return out;
}

// ---- a layer's elementwise glue: RMSNorm, rotary embeddings, SiLU times up ----
// One call each where torch took 6-8 operators (and as many Python calls): 4.2 ms of the 1.5B model's 38 ms
// one-token forward and 3.5 of the 0.5B's 18 were those operators (2026-12-05, AMD EPYC steered to AVX2).
// Each output depends on its own row alone, computed the same way on every vector width.

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
// model/decoder.py's Layer on these kernels, its Python glue gone (2.6-2.8 ms of a one-token step of the
// 0.5B model: 24 layers of a dozen calls each): RMSNorm, q, k and v in one call, both rotations, this
// forward's keys and values written into the cache, attention, o, the residual sum, RMSNorm, gate and up in
// one call, SiLU times up, down, the residual sum. Each step is the op a call of its own runs, on the same
// inputs in the same order, so the layer's output is the Python layer's, bit for bit.
// x (1, T, hidden) at positions first .. first + T - 1; the layer's seven linear layers in the order q, k,
// v, o, gate, up, down, packed as q8_linear's (bits 8) or q4_linear's (bits 4) weights; cos and sin (T, D);
// the cache's keys and values (1, H_kv, >= first + T, D), float32 or float16, this forward's written at
// first .. first + T - 1 (rounded to their dtype as a copy rounds). Returns x after the layer.
c10::List<c10::optional<at::Tensor>> some_of(const c10::List<c10::optional<at::Tensor>>& all, size_t from,
                                             size_t count) {
  c10::List<c10::optional<at::Tensor>> part;
  for (size_t i = from; i < from + count; ++i) part.push_back(all.get(i));
  return part;
}

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

// float16's smallest positive value, 2^-24: the least scale a group keeps.
constexpr float kLeastHalf = 5.9604644775390625e-8f;
// v rounded to the nearest float16 (to even), as a float.
inline float as_half(float v) { return static_cast<float>(at::Half(v)); }

// A weight's level for this scale and offset, as it is stored: round((w - offset) / scale) to even (as
// torch.round), within [lowest, highest].
inline float level_of(float w, float scale, float offset, float lowest, float highest) {
  return std::clamp(std::nearbyint((w - offset) / scale), lowest, highest);
}

// A group's 4-bit levels' squared error with this scale and offset (the levels as they would be stored),
// summed in 8 lanes (so that the compiler keeps them in one vector) and then the lanes in order.
template <int64_t G>
float squared_error(const float* row, float scale, float offset) {
  float lanes[8] = {};
  for (int i = 0; i < G; i += 8) {
    for (int lane = 0; lane < 8; ++lane) {
      const float level = level_of(row[i + lane], scale, offset, 0.0f, 15.0f);
      const float error = level * scale + offset - row[i + lane];
      lanes[lane] += error * error;
    }
  }
  float sum = 0.0f;
  for (const float lane : lanes) sum += lane;
  return sum;
}

// The scale of a group of 4-bit levels from `offset` (its lowest weight): of (high - low) / n for n = 15
// down to 8, the one whose levels leave the least squared error (the larger n on a tie). A group whose
// weights are evenly spaced values s steps apart from lowest to highest, s <= 15 (a GGUF's Q4_K levels: a
// 6-bit scale and minimum per 32 weights), is found on them within its stored weights' rounding: one of
// 8..15 is a multiple of every s. With n = 15 alone, a fifth of such groups fell between levels (the 1.5B
// model's Q4_K layers: 250 times the squared error).
template <int64_t G>
float q4_scale(const float* row, float low, float high, float offset) {
  float best = as_half(std::max((high - low) / 15.0f, kLeastHalf));
  float least = squared_error<G>(row, best, offset);
  for (int n = 14; n >= 8 && least > 0.0f; --n) {
    const float scale = as_half(std::max((high - low) / static_cast<float>(n), kLeastHalf));
    const float error = squared_error<G>(row, scale, offset);
    if (error < least) {
      least = error;
      best = scale;
    }
  }
  return best;
}

// One panel's weights quantized (see q8_quantize, q4_quantize): rows [panel * 16, +16) of w (N, K), rows
// past N zeros.
template <int Bits, int64_t G, typename T>
void quantize_panel(const T* w, int64_t N, int64_t K, int64_t panel, uint8_t* q, at::Half* scales,
                    at::Half* offsets) {
  constexpr float kTop = (1 << Bits) - 1;  // the highest level: 255 or 15
  // The stored levels as signed ones: -128..127 at 8 bits (stored + 128), 0..15 at 4.
  constexpr float kLowest = Bits == 8 ? -128.0f : 0.0f, kHighest = Bits == 8 ? 127.0f : kTop;
  float row[G];
  for (int r = 0; r < kPanel; ++r) {
    const int64_t n = panel * kPanel + r;
    for (int64_t g = 0; g < K / G; ++g) {
      float low = 0.0f, high = 0.0f;
      for (int i = 0; i < G; ++i) {
        row[i] = n < N ? static_cast<float>(w[n * K + g * G + i]) : 0.0f;
        low = i == 0 ? row[i] : std::min(low, row[i]);
        high = i == 0 ? row[i] : std::max(high, row[i]);
      }
      // Each operation rounded on its own, as torch's would be (-ffp-contract=off: no fused multiply-add);
      // the scale and offset rounded to float16 as they are kept, and the levels chosen for those.
      float scale, offset;
      if constexpr (Bits == 8) {  // levels centred on 128
        scale = as_half(std::max((high - low) / kTop, kLeastHalf));
        offset = as_half(low + 128.0f * scale);
      } else {
        offset = as_half(low);
        scale = q4_scale<G>(row, low, high, offset);
      }
      TORCH_CHECK(std::isfinite(scale) && std::isfinite(offset), "quantize: a weight beyond float16's range");
      const int64_t at = (panel * (K / G) + g) * kPanel + r;
      scales[at] = at::Half(scale);
      offsets[at] = at::Half(offset);
      for (int i = 0; i < G; ++i) {
        const float level = level_of(row[i], scale, offset, kLowest, kHighest);
        const int64_t k = g * G + i;
        uint8_t* block = q + (panel * (K / kBlockInputs<Bits>) + k / kBlockInputs<Bits>) * kQuadBytes + r * kQuad + k % kQuad;
        if constexpr (Bits == 8) {
          *block = static_cast<uint8_t>(level + 128.0f);
        } else {  // inputs 0-3 of a block of 8 in the low nibble, 4-7 in the high one
          const uint8_t u = static_cast<uint8_t>(level);
          *block = k % kBlockInputs<Bits> < kQuad ? u : static_cast<uint8_t>(*block | (u << 4));
        }
      }
    }
  }
}

// (N, K) weights -> q8_linear's (q, scales, offsets): per group of `group` inputs (32 or 128), 256 levels
// from the group's lowest weight to its highest, scale = half((high - low) / 255), offset = half(low + 128 *
// scale), q = round((w - offset) / scale) + 128 (half: to the nearest float16, the scale at least 2^-24); N
// padded with zero rows to a multiple of 16. One pass over the weights, a panel per task (the same arithmetic
// in torch's ops took 3 s for the 0.5B model's weights, most of its load). q4_quantize: the same with 16
// levels, offset = half(low), scale = half((high - low) / n) for the n in 15..8 whose levels leave the least
// squared error (`q4_scale`), q = round((w - offset) / scale), two levels a byte (q4_linear's packing,
// (N/16, K/8, 64)).
template <int Bits, int64_t G>
std::tuple<at::Tensor, at::Tensor, at::Tensor> int_quantize(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % G == 0, "quantize: (N, K) weights, K a multiple of ", G);
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + kPanel - 1) / kPanel;
  at::Tensor q = at::zeros({panels, K / kBlockInputs<Bits>, kQuadBytes}, w.options().dtype(at::kByte));
  at::Tensor scales = at::empty({panels, K / G, kPanel}, w.options().dtype(at::kHalf));
  at::Tensor offsets = at::empty_like(scales);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w.scalar_type(), "quantize", [&] {
    const scalar_t* wp = w.data_ptr<scalar_t>();
    at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
      for (int64_t panel = first; panel < last; ++panel)
        quantize_panel<Bits, G>(wp, N, K, panel, q.data_ptr<uint8_t>(), scales.data_ptr<at::Half>(),
                                offsets.data_ptr<at::Half>());
    });
  });
  return {q, scales, offsets};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> q8_quantize(const at::Tensor& weight, int64_t group) {
  TORCH_CHECK(group == kGroup || group == kWideGroup, "q8_quantize: groups of 32 or 128 inputs, not ", group);
  return group == kWideGroup ? int_quantize<8, kWideGroup>(weight) : int_quantize<8, kGroup>(weight);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> q4_quantize(const at::Tensor& weight) {
  return int_quantize<4, kGroup>(weight);
}

}  // namespace

// ---- the same ops for a process without torch's Python: a C ABI (model/torchless.py) ----
// A one-off `specedit rewrite` runs its model through these before, or without, importing torch (whose
// import is most of a cold start's time): each wraps its caller's buffers as tensors, without a copy, and
// calls the op above, so its outputs are that op's, bit for bit. Each returns null, or what went wrong (valid
// until the calling thread's next call).

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

TORCH_LIBRARY(specedit, m) {
  m.def("q8_linear(Tensor input, Tensor q, Tensor scales, Tensor offsets, Tensor? bias) -> Tensor");
  m.def("q8_quantize(Tensor weight, int group=32) -> (Tensor, Tensor, Tensor)");
  m.def("q5_linear(Tensor input, Tensor q, Tensor scales, Tensor offsets, Tensor? bias) -> Tensor");
  m.def("q4_linear(Tensor input, Tensor q, Tensor scales, Tensor offsets, Tensor? bias) -> Tensor");
  m.def("q4_quantize(Tensor weight) -> (Tensor, Tensor, Tensor)");
  m.def("linears(Tensor input, Tensor[] q, Tensor[] scales, Tensor[] offsets, Tensor?[] bias, int[] bits) -> Tensor[]");
  m.def("rms_norm(Tensor input, Tensor weight, float eps) -> Tensor");
  m.def("rotary(Tensor states, Tensor cos, Tensor sin, int heads) -> Tensor");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("attention(Tensor query, Tensor key, Tensor value, int first, float scale) -> Tensor");
  m.def(
      "decoder_layer(Tensor x, Tensor input_norm, Tensor post_norm, float eps, Tensor[] q, Tensor[] scales, "
      "Tensor[] offsets, Tensor?[] bias, int[] bits, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
      "int first, float scale, int heads, int kv_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(specedit, CPU, m) {
  m.impl("q8_linear", q8_linear);
  m.impl("q8_quantize", q8_quantize);
  m.impl("q5_linear", q5_linear);
  m.impl("q4_linear", q4_linear);
  m.impl("q4_quantize", q4_quantize);
  m.impl("linears", linears);
  m.impl("rms_norm", rms_norm);
  m.impl("rotary", rotary);
  m.impl("silu_mul", silu_mul);
  m.impl("attention", attention);
  m.impl("decoder_layer", decoder_layer);
}
