// Linear layers on integer weights: x @ W^T + bias, the activations quantized as they go, the products of
// levels summed exactly in integers.
// - specedit::q8_linear(x, q, scales, offsets, bias) on int8 weights with a scale and an offset per group of G
//   inputs (128, or 32 where K is not a multiple of 128): W[n, k] = scales[n, k / G] * (q[n, k] - 128) +
//   offsets[n, k / G], q unsigned levels packed in panels of 16 outputs, 4 inputs a lane (q (N/16, K/4, 16 *
//   4), scales and offsets float16 (N/16, K/G, 16), widened to float32 exactly as they are read). The
//   activations are quantized per row and group: levels a = round(x * 127 / max|x|) in -127..127, each
//   standing for d = max|x| / 127 (kActivationTop);
// - specedit::q4_linear: the same on 4-bit weights in groups of 32, W[n, k] = scales[n, k / 32] * q[n, k] +
//   offsets[n, k / 32], q in 0..15, two a byte: a lane's 8 inputs in 4 bytes, the first 4 in the low nibbles
//   (q (N/16, K/8, 16 * 4)), half the bytes of int8 to stream at every step;
// - specedit::q5_linear: the same on 5-bit weights in groups of 32, q in 0..31 a byte, packed as int8's (a
//   GGUF's Q5_0 levels as they are: model/gguf_levels.py);
// - specedit::linears: several layers on one input (q, k and v; gate and up), each of its own width, the
//   activations quantized once per group size, each layer's outputs its own call's.
//
// Row-invariant by construction: each row's activations are quantized alone; per group, the sum of the G
// products of levels is exact in int32, however the instructions pair them (4-bit levels without VNNI sum a
// group in 16-bit lanes first, 16 products of at most 15 * 127; 5-bit ones half a group, 8 products of at
// most 31 * 127). Then each output is one chain of float32 fused multiply-adds over the groups in order, from
// zero: acc += that sum * (scale * d), acc += offset * (d * the sum of the row's levels), then the bias.
// Only the blocking changes with the number of rows. A forward of a few rows streams its weights once (their
// bytes are the cost); a larger one keeps a block of panels in the cache for its row blocks (the arithmetic
// is the cost). With VNNI, vpdpbusd sums 4 byte products a lane per instruction; on AVX2, vpmaddwd sums 2 and
// 2 as 16-bit words. They multiply the weights' unsigned levels u by the activations' a, less 128 * (the sum
// of a) a group (int4 and int5: vpmaddubsw, then vpmaddwd).
#include "kernels.h"

namespace {

// Four bytes (four int8 levels, or two int16 ones) as one int32, to broadcast to every lane.
template <typename T>
inline int32_t four_bytes(const T* p) {
  int32_t four;
  std::memcpy(&four, p, sizeof four);
  return four;
}

// The integer vectors, on the float vectors' width (kernels.h).
#if defined(__AVX512F__) && !defined(SPECEDIT_256)
using IVec = __m512i;  // 16 int32 lanes, or 64 bytes: 4 of each lane's output
inline void store_int8(int8_t* p, Vec levels) {  // levels in -127..127
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(levels)));
}
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline IVec ibroadcast(int32_t v) { return _mm512_set1_epi32(v); }
inline Vec to_float(IVec v) { return _mm512_cvtepi32_ps(v); }
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
using IVec = __m256i;
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
// AVX-VNNI (recent laptops), or AVX-512 VNNI's instruction on 8 lanes: as on 16 lanes above.
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
// On AVX2 without VNNI, a forward of many rows makes each panel's 16-bit words once (`split_panels`) and
// reads them back for every block of rows, rather than masking and shifting them again. Fewer rows do not
// repay the stores, nor do AVX-512's 16 lanes. measured: from 128 rows, docs/kernels.md ("The kernel's shape")
constexpr bool kSplitWeights = !kVnni && kLanes == 8;
constexpr int64_t kSplitRows = 128;

// Holds a block's sums in registers at this point (the end of a quad): GCC otherwise reassociates a group's
// integer sums across its quads and keeps the products of all of them on the stack.
template <typename T, int R, int P, int V>
inline void in_registers(T (&sums)[R][P][V]) {
  UNROLL for (int r = 0; r < R; ++r)
    UNROLL for (int p = 0; p < P; ++p)
      UNROLL for (int h = 0; h < V; ++h) asm volatile("" : "+v"(sums[r][p][h]));
}

constexpr int kVectors = kPanel / kLanes;  // vectors per panel: 2 (AVX2) or 1 (AVX-512)
constexpr int kDirectRows = 4;            // forwards of up to this many rows stream the weights once

// ---- int8, int5 and int4 weights ----

// 5-bit levels (0..31, a byte each, laid out as 8-bit ones) without VNNI: vpmaddubsw pairs them with the
// activations' levels into 16-bit lanes, which hold half a group (4 quads: 8 products of at most 31 * 127,
// 31,496) exactly before they are widened to 32 bits. One multiply-add where int8 takes two.
constexpr int kHalfGroupQuads = 4;
// 16 vector registers where AVX-512's encoding is not compiled in (AVX2, AVX-VNNI), 32 where it is (16 lanes,
// or 8 with AVX-512 VL: SPECEDIT_256). The sums, the weights and the activations in flight must fit them: a
// block that spills its sums to the stack takes up to 1.5x the time.
#if defined(__AVX512F__)
constexpr bool kFewRegisters = false;
#else
constexpr bool kFewRegisters = true;
#endif
// The register block of a many-row forward: 6 rows by 16 outputs (8 lanes) or 48 (16 lanes) with 32
// registers. With 16, 4 rows, whose sums take 2 registers a row, or 3 where a row needs more: 4-bit blocks
// with VNNI broadcast two sets of activations a row, 5-bit levels without VNNI hold a 16-bit sum beside each
// 32-bit one. measured: the fastest of 2-8 rows by 16-64 outputs, docs/kernels.md ("The kernel's shape")
template <int Bits>
constexpr int kIntRows = !kFewRegisters ? 6 : ((kVnni && Bits == 4) || (!kVnni && Bits == 5) ? 3 : 4);
constexpr int kIntPanels = kVectors == 2 ? 1 : 3;

// Rows a block of a many-row forward takes on this CPU: kIntRows, but 4 on AMD's cores with 16 lanes and
// VNNI. There 6 rows' sums and accumulators do not fit 32 registers, and Zen 4 splits each 64-byte spill into
// two 32-byte loads and stores. Every block computes each output alike: the same bits.
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
// for more, whose sums then fit beside the weights'.
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

// The activations' highest level: int8's 127. At 63, AVX2 could pair the weights' stored bytes by vpmaddubsw,
// but over groups of 128 inputs that doubled the distance from float32 (docs/kernels.md, "What we tried").
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
    // Each row widens the panel's float16 scales and offsets again: widening them once for all R rows would
    // hold them in registers the block lacks.
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
  // reading them back from `split` costs more than it saves for one row.
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

}  // namespace
