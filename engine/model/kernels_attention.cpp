// Causal attention on one kernel: specedit::attention(query, key, value, first, scale), one sequence's
// queries on the keys and values of every position up to theirs, grouped-query heads (model/invariant.py):
// scores, softmax and weighted values in one pass a block of queries. The keys and values are float32 or
// float16 (a cache of half the bytes), widened to float32 exactly as they are read.
//
// Row-invariant by construction: each query's scores are chains of fused multiply-adds over the head's width
// in order, its softmax runs over the keys up to its own position in their order, and so do its weighted
// values. A block of up to 64 queries, a query a lane, reads each key once.
#include "kernels.h"

namespace {

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
// tiles of kValueQueries queries by kValueVectors vectors of outputs, a key chunk at a time: the chunk's
// values and e stay in the cache while every tile reads them. A query at a time over all keys would read the
// values from memory once a query, past a few thousand keys (docs/kernels.md, "Attention on one kernel").
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
// chains of multiply-adds in flight, a load of a query vector for every 6 of them, so the loads keep up.
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

}  // namespace
