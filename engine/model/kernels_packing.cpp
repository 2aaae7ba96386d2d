// A layer's weights quantized and packed for the linear kernels (kernels_linears.cpp), in one pass.
// - specedit::q8_quantize(w, G): (N, K) weights -> q8_linear's (q, scales, offsets), groups of G = 32 or 128;
// - specedit::q4_quantize(w): the same for q4_linear, groups of 32, two levels a byte.
// Each operation is rounded on its own (no fused multiply-add), so every variant packs the same levels.
#include "kernels.h"

namespace {

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
// 8..15 is a multiple of every s. With n = 15 alone, such groups would fall between levels.
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
// padded with zero rows to a multiple of 16. One pass over the weights, a panel per task: torch's ops take a
// pass a step, most of a load's time. q4_quantize: the same with 16 levels, offset = half(low), scale =
// half((high - low) / n) for the n in 15..8 whose levels leave the least squared error (`q4_scale`), q =
// round((w - offset) / scale), two levels a byte (q4_linear's packing, (N/16, K/8, 64)).
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
