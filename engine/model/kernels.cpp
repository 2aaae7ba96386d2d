// specedit's CPU kernels (built and loaded by model/kernels.py): results whose rows never depend on the
// rows beside them, which the engine's exactness rests on (model/invariant.py). Whatever the number of rows,
// the rows or outputs computed beside one, the thread count or the CPU, each output is computed the same
// way. Activations and results are float32.
//
// The ops, one file a family, as ggml keeps its CPU kernels:
// - kernels_linears.cpp: q8_linear, q5_linear, q4_linear and linears, on integer weights;
// - kernels_packing.cpp: q8_quantize and q4_quantize, the weights those read;
// - kernels_attention.cpp: attention;
// - kernels_layer.cpp: rms_norm, rotary, silu_mul, and decoder_layer, a whole layer in one call;
// - kernels_c_abi.cpp: the same ops for a process without torch's Python (model/torchless.py);
// - kernels_peak.cpp: the machine's integer peak on the linears' own instructions (model/peak.py).
// kernels.h holds what they share: the vectors, the packing's constants, and the ops' declarations.
//
// This file is the library's one translation unit: it includes every family, so ATen's headers are parsed
// once a compile, then registers the ops with torch. Compiled for AVX2 (8 lanes a vector) or AVX-512 (16),
// with VNNI or without: each lane is an output, computed the same way, bit for bit.
#include <torch/library.h>

#include "kernels.h"
#include "kernels_linears.cpp"
#include "kernels_packing.cpp"
#include "kernels_attention.cpp"
#include "kernels_layer.cpp"
#include "kernels_c_abi.cpp"
#include "kernels_peak.cpp"

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
