// The machine's integer peak (model/peak.py): the int8 kernels' own multiply-accumulate, from registers
// only, on torch's threads at once, through the C ABI. The instructions are kernels_linears.cpp's own
// functions, on the variant's width:
// - with VNNI (AVX-512 VNNI, or AVX-VNNI), `dot8` is one vpdpbusd: 4 byte products a lane, for every width
//   of levels;
// - without, `dot8` multiplies 8-bit levels as 16-bit words: two vpmaddwd and two vpaddd for 4 products a
//   lane. 4- and 5-bit levels go by vpmaddubsw into 16-bit sums (`dot4_small`, with vpaddw), widened by
//   vpmaddwd and vpaddd every 4 of them (`small_sums`), as the kernels sum half a group.
// Each thread runs independent chains of sums, more than an instruction's latency times its throughput, so
// the loop is bound by the multipliers alone. An empty asm statement marks a value as changed: the inputs
// before each product, so that it is computed again, and each sum after it, so that it stays one chain in a
// register (as `in_registers` does). It emits nothing, and the compiler keeps every sum it reads.
#include <chrono>

#include "kernels.h"

namespace {

inline void changed(IVec& value) { asm volatile("" : "+v"(value)); }
#if defined(__AVXVNNI__) || defined(__AVX512VNNI__)
inline void changed(Activations8& x) { changed(x.a); }
#else
inline void changed(Weights8& u) { changed(u.even), changed(u.odd); }
inline void changed(Activations8& x) { changed(x.even), changed(x.odd); }
#endif

constexpr int64_t kPeakProducts = 4;  // byte products a 32-bit lane sums a step, on every path
constexpr int kPeakQuads = 4;         // steps a 16-bit sum takes before it is widened (half a group)
// Chains a thread runs: with VNNI, vpdpbusd's latency of 4-5 cycles times its 2 a cycle. Without, the chain
// is vpaddd's or vpaddw's one cycle, and 4 chains leave registers for the products (with 16 registers, 5
// spilled one to the stack).
constexpr int kPeakChains = kVnni ? 12 : 4;

// One thread's `iterations` of int8's steps: each chain's sum += `dot8` of a vector of weights and a row's
// activations. (Not inlined: inside OpenMP's outlined region GCC kept the sums on the stack.)
[[gnu::noinline]] void int8_steps(int64_t iterations, int32_t seed) {
  Weights8 u = weights8(ibroadcast(seed));
  const int8_t levels[kQuad] = {1, 2, 3, 4};
  const int16_t words[kQuad] = {1, 3, 2, 4};  // (`Levels::wide`'s order)
  Activations8 a = activations8(levels, words);
  IVec sums[kPeakChains];
  UNROLL for (int c = 0; c < kPeakChains; ++c) sums[c] = ibroadcast(c);
  for (int64_t i = 0; i < iterations; ++i) {
    UNROLL for (int c = 0; c < kPeakChains; ++c) {
      changed(u), changed(a);
      sums[c] = dot8(sums[c], u, a);
      changed(sums[c]);
    }
  }
}

#if defined(__AVXVNNI__) || defined(__AVX512VNNI__)
// With VNNI, 4- and 5-bit levels take int8's instruction.
[[gnu::noinline]] void narrow_steps(int64_t iterations, int32_t seed) { int8_steps(iterations, seed); }
#else
// The 4- and 5-bit levels' steps without VNNI: `kPeakQuads` of `dot4_small` a chain, then `small_sums`
// added to its 32-bit sum.
[[gnu::noinline]] void narrow_steps(int64_t iterations, int32_t seed) {
  IVec u = ibroadcast(seed), a = ibroadcast(seed * 7 + 1);
  IVec sums[kPeakChains];
  UNROLL for (int c = 0; c < kPeakChains; ++c) sums[c] = ibroadcast(c);
  for (int64_t i = 0; i < iterations; i += kPeakQuads) {
    IVec small[kPeakChains];
    UNROLL for (int c = 0; c < kPeakChains; ++c) small[c] = izero();
    UNROLL for (int q = 0; q < kPeakQuads; ++q)
      UNROLL for (int c = 0; c < kPeakChains; ++c) {
        changed(u), changed(a);
        small[c] = dot4_small(small[c], u, a);
        changed(small[c]);
      }
    UNROLL for (int c = 0; c < kPeakChains; ++c) {
      sums[c] = iadd(sums[c], small_sums(small[c]));
      changed(sums[c]);
    }
  }
}
#endif

}  // namespace

extern "C" {

// Ops (a multiply-add is 2) an iteration of a thread's loop computes: on path 8 (int8 weights' products)
// or 4 (4- and 5-bit levels').
int64_t specedit_peak_ops(int64_t) { return kPeakChains * kLanes * kPeakProducts * 2; }

// Seconds from the first thread's start to the last one's end of `iterations` (a multiple of 4) of the
// path's loop on each of `threads` of torch's threads (at::parallel_for: one each); -1 for arguments out of
// range. Each thread notes its own start and end: waking the pool and joining it do not count, and threads
// that did not overlap count their sum.
double specedit_peak_seconds(int64_t threads, int64_t iterations, int64_t path) {
  using Clock = std::chrono::steady_clock;
  if (threads < 1 || iterations < 1 || iterations % kPeakQuads != 0 || (path != 8 && path != 4)) return -1.0;
  std::vector<Clock::time_point> starts(threads), ends(threads);
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int32_t seed = static_cast<int32_t>(t) + 1;
      starts[t] = Clock::now();
      if (path == 4)
        narrow_steps(iterations, seed);
      else
        int8_steps(iterations, seed);
      ends[t] = Clock::now();
    }
  });
  const Clock::time_point start = *std::min_element(starts.begin(), starts.end());
  const Clock::time_point end = *std::max_element(ends.begin(), ends.end());
  return std::chrono::duration<double>(end - start).count();
}

}  // extern "C"
