// radixlang_cpu::lora_delta: the gathered LoRA delta of a step whose rows use different adapters, in one call per
// fused linear: y[t] += B[s] (A[s] x[t]) for each row t whose slot s = slots[t] is not 0 (0: the base model, no
// delta). Built into the block kernel's library (block_kernel.py compiles and loads it); kernels/lora.py calls it.
//
// Operands as runtime/lora/pool.py stacks them: A [S, G R, K] (the G targets sharing the input, R rank rows
// each), B^T [S, G R, N], x and y fp32. The weights are fp32 (the exact mode), or int8 with an fp32 scale per
// rank row of A and of B^T (the default mode: a quarter of the bytes, which a decode step reads whole: at 8
// adapters of rank 16 they outweigh the base model's 4-bit blocks). `columns` (G + 1 bounds) says which output columns each target owns: target g's rank rows
// [g R, g R + R) feed only columns [columns[g], columns[g + 1]), so the zero blocks of a fused q|k|v B are never
// read (a third of its bytes) nor multiplied.
//
// Rows are grouped by slot (S-LoRA / Punica's gathered matmul), a group split in chunks of kChunk rows: one work
// item shrinks its chunk to the rank (h = x A^T, kept in fp32) and expands it (y += h B^T), reading its adapter's
// weights once for all its rows. Each output's sums run in one fixed order, so a row's delta is the same bits
// whatever rows, adapters or threads share the call (the determinism rule):
//   shrink h[t, j]: lane l (of 16) accumulates x[t, k] * A[s, j, k] over k = 16 i + l with one fused multiply-add
//     each (the last vector zero-padded), then the 16 lanes fold as dense_mm.cpp's (lanes16.h); int8: times
//     A's row scale;
//   expand y[t, n]: d = 0, then d = fma(h[t, g R + r], B^T[s, g R + r, n], d) for r = 0 .. R - 1 (int8: h times
//     B^T's row scale first), then y += d.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "lanes16.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using radixlang_cpu_lanes::fold;
using radixlang_cpu_lanes::Lanes16;

constexpr int64_t kChunk = 16;  // rows of one slot per work item (more: its own item, same bits)
#if defined(__AVX512F__)
constexpr int kShrinkRows = 4, kShrinkRanks = 4, kExpandRows = 4, kExpandVectors = 4;
#else
constexpr int kShrinkRows = 2, kShrinkRanks = 2, kExpandRows = 2, kExpandVectors = 2;
#endif

template <typename W>
inline Lanes16 load_part(const W* p, int64_t n) {  // the first n of 16 values, the rest zero
  W buf[16] = {};
  std::copy(p, p + n, buf);
  return Lanes16::load(buf);
}

// h[r][f] = x_r . a_f over K for RR rows and F rank rows: each x vector loaded once for F rank rows
template <typename W, int RR, int F>
inline void shrink_tile(const float* const* x, const W* a, int64_t k, float* h, int64_t h_stride) {
  Lanes16 acc[RR][F];
  for (int r = 0; r < RR; ++r)
    for (int f = 0; f < F; ++f) acc[r][f] = Lanes16::zero();
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    Lanes16 xv[RR];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) xv[r] = Lanes16::load(x[r] + t);
#pragma GCC unroll 8
    for (int f = 0; f < F; ++f) {
      const Lanes16 wv = Lanes16::load(a + f * k + t);
#pragma GCC unroll 8
      for (int r = 0; r < RR; ++r) acc[r][f] = Lanes16::fma(xv[r], wv, acc[r][f]);
    }
  }
  if (t < k) {
    for (int f = 0; f < F; ++f) {
      const Lanes16 wv = load_part(a + f * k + t, k - t);
      for (int r = 0; r < RR; ++r) acc[r][f] = Lanes16::fma(load_part(x[r] + t, k - t), wv, acc[r][f]);
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int f = 0; f < F; ++f) h[r * h_stride + f] = fold(acc[r][f]);
}

template <typename W, int F>
void shrink_rows(const float* const* x, int64_t m, const W* a, int64_t k, float* h, int64_t h_stride) {
  for (int64_t r0 = 0; r0 < m; r0 += kShrinkRows) {
    float* hr = h + r0 * h_stride;
    switch (std::min<int64_t>(kShrinkRows, m - r0)) {
#if defined(__AVX512F__)
      case 4: shrink_tile<W, 4, F>(x + r0, a, k, hr, h_stride); break;
      case 3: shrink_tile<W, 3, F>(x + r0, a, k, hr, h_stride); break;
#endif
      case 2: shrink_tile<W, 2, F>(x + r0, a, k, hr, h_stride); break;
      default: shrink_tile<W, 1, F>(x + r0, a, k, hr, h_stride); break;
    }
  }
}

// y_r[c] += sum_j h_r[j] B^T[j, c] over `rank` rank rows, for RR rows and the V * 16 columns from b / y_r
// (`cols` of them real: a partial last block reads and writes only those)
template <typename W, int RR, int V>
inline void expand_tile(const float* const* h, const W* b, int64_t rank, int64_t n, float* const* y, int64_t cols) {
  Lanes16 acc[RR][V];
  for (int r = 0; r < RR; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = Lanes16::zero();
  const bool full = cols == 16 * V;
  for (int64_t j = 0; j < rank; ++j) {
    Lanes16 hv[RR];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) hv[r] = Lanes16::all(h[r][j]);
    const W* bj = b + j * n;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const int64_t left = cols - 16 * v;
      const Lanes16 bv = full || left >= 16 ? Lanes16::load(bj + 16 * v)
                                            : load_part(bj + 16 * v, std::max<int64_t>(left, 0));
#pragma GCC unroll 8
      for (int r = 0; r < RR; ++r) acc[r][v] = Lanes16::fma(hv[r], bv, acc[r][v]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int v = 0; v < V; ++v) {
      const int64_t left = cols - 16 * v;
      if (left >= 16) {
        Lanes16::add(Lanes16::load(y[r] + 16 * v), acc[r][v]).store(y[r] + 16 * v);
      } else if (left > 0) {
        float out[16];
        Lanes16::add(load_part(y[r] + 16 * v, left), acc[r][v]).store(out);
        std::copy(out, out + left, y[r] + 16 * v);
      }
    }
  }
}

template <typename W>
void expand_rows(const float* const* h, int64_t m, const W* b, int64_t rank, int64_t n, float* const* y,
                 int64_t cols) {
  for (int64_t r0 = 0; r0 < m; r0 += kExpandRows) {
    switch (std::min<int64_t>(kExpandRows, m - r0)) {
#if defined(__AVX512F__)
      case 4: expand_tile<W, 4, kExpandVectors>(h + r0, b, rank, n, y + r0, cols); break;
      case 3: expand_tile<W, 3, kExpandVectors>(h + r0, b, rank, n, y + r0, cols); break;
#endif
      case 2: expand_tile<W, 2, kExpandVectors>(h + r0, b, rank, n, y + r0, cols); break;
      default: expand_tile<W, 1, kExpandVectors>(h + r0, b, rank, n, y + r0, cols); break;
    }
  }
}

// the lines of `cols` columns of `rows` rows, n apart, into L1
template <typename W>
inline void prefetch_block(const W* b, int64_t rows, int64_t n, int64_t cols) {
  const char* p = reinterpret_cast<const char*>(b);
  const int64_t stride = n * static_cast<int64_t>(sizeof(W)), bytes = cols * static_cast<int64_t>(sizeof(W));
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + j * stride + off, _MM_HINT_T0);
}

struct Item {  // one work item: up to kChunk rows of one slot
  int64_t slot, first, count;  // rows order[first, first + count)
};

struct Scales {  // int8 weights' fp32 scale per rank row, [S, G R] each; null for fp32 weights
  const float* a;
  const float* bt;
};

template <typename W>
void run_item(const Item& item, const int64_t* order, const float* x, int64_t k, const W* a, const W* bt,
              Scales scales, int64_t gr, int64_t rank, const std::vector<int64_t>& columns, float* y, int64_t n) {
  const float* xs[kChunk];
  float* ys[kChunk];
  const float* hs[kChunk];
  float h[kChunk * 768];  // 3 targets of rank 256 at most (checked by the op)
  for (int64_t i = 0; i < item.count; ++i) {
    xs[i] = x + order[item.first + i] * k;
    ys[i] = y + order[item.first + i] * n;
  }
  const W* as = a + item.slot * gr * k;
  const W* bs = bt + item.slot * gr * n;
  constexpr int64_t block = 16 * kExpandVectors;
  {  // all of the slot's A at once, and each target's first block of B^T: many lines in flight, where the
     // shrink's few row streams would wait on each in turn
    const char* p = reinterpret_cast<const char*>(as);
    for (int64_t off = 0; off < gr * k * static_cast<int64_t>(sizeof(W)); off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    for (size_t g = 0; g + 1 < columns.size(); ++g)
      prefetch_block(bs + g * rank * n + columns[g], rank, n, std::min(block, columns[g + 1] - columns[g]));
  }
  constexpr int F = kShrinkRanks;
  int64_t j = 0;
  for (; j + F <= gr; j += F) shrink_rows<W, F>(xs, item.count, as + j * k, k, h + j, gr);
  for (; j < gr; ++j) shrink_rows<W, 1>(xs, item.count, as + j * k, k, h + j, gr);
  if constexpr (std::is_same_v<W, int8_t>) {  // h = (x . q_A) s_A, then h s_B: what the expand multiplies
    const float* sa = scales.a + item.slot * gr;
    const float* sb = scales.bt + item.slot * gr;
    for (int64_t i = 0; i < item.count; ++i)
      for (int64_t r = 0; r < gr; ++r) h[i * gr + r] = h[i * gr + r] * sa[r] * sb[r];
  }
  for (size_t g = 0; g + 1 < columns.size(); ++g) {
    for (int64_t i = 0; i < item.count; ++i) hs[i] = h + i * gr + g * rank;
    for (int64_t c = columns[g]; c < columns[g + 1]; c += block) {
      // the next block's B^T lines, one per rank row, N apart: too many strided streams for the hardware's
      // prefetcher, and a decode reads each from memory once
      if (c + block < columns[g + 1])
        prefetch_block(bs + g * rank * n + c + block, rank, n, std::min(block, columns[g + 1] - c - block));
      float* yc[kChunk];
      for (int64_t i = 0; i < item.count; ++i) yc[i] = ys[i] + c;
      expand_rows<W>(hs, item.count, bs + g * rank * n + c, rank, n, yc, std::min(block, columns[g + 1] - c));
    }
  }
}

void lora_delta(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& bt,
                const at::Tensor& slots, at::IntArrayRef columns, const std::optional<at::Tensor>& a_scale,
                const std::optional<at::Tensor>& bt_scale) {
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat && y.is_contiguous(), "lora_delta: y must be a "
              "contiguous 2-D float32 tensor");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(0) == y.size(0), "lora_delta: x must be a "
              "2-D float32 tensor of y's rows");
  TORCH_CHECK(a.dim() == 3 && bt.dim() == 3 && a.is_contiguous() && bt.is_contiguous(), "lora_delta: A and B^T "
              "must be contiguous [slots, ranks, features]");
  const auto wtype = a.scalar_type();
  TORCH_CHECK(bt.scalar_type() == wtype && (wtype == at::kFloat || wtype == at::kBFloat16 || wtype == at::kChar),
              "lora_delta: A and B^T must both be float32, bfloat16 or int8");
  const bool quantized = wtype == at::kChar;
  TORCH_CHECK(quantized == (a_scale.has_value() && bt_scale.has_value()), "lora_delta: int8 weights take "
              "a_scale and bt_scale (and only they do)");
  if (quantized) {
    for (const at::Tensor& sc : {*a_scale, *bt_scale})
      TORCH_CHECK(sc.scalar_type() == at::kFloat && sc.is_contiguous() && sc.dim() == 2 && sc.size(0) == a.size(0) &&
                  sc.size(1) == a.size(1), "lora_delta: scales must be contiguous float32 [S, G R]");
  }
  TORCH_CHECK(a.size(0) == bt.size(0) && a.size(1) == bt.size(1) && a.size(2) == x.size(1) && bt.size(2) == y.size(1),
              "lora_delta: A [S, GR, K] and B^T [S, GR, N] do not fit x [T, K] and y [T, N]");
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong && slots.size(0) == y.size(0),
              "lora_delta: slots must be int64, one per row");
  const int64_t groups = static_cast<int64_t>(columns.size()) - 1, gr = a.size(1);
  TORCH_CHECK(groups >= 1 && gr % groups == 0 && gr <= 768, "lora_delta: ", gr, " rank rows for ", groups,
              " targets (at most 768)");
  TORCH_CHECK(columns.front() == 0 && columns.back() == y.size(1), "lora_delta: columns must run from 0 to N");
  const at::Tensor xc = x.contiguous(), sc = slots.contiguous();
  const int64_t rows = y.size(0), k = x.size(1), n = y.size(1), num_slots = a.size(0);
  const int64_t* sp = sc.data_ptr<int64_t>();
  // the rows of each slot, in row order (a counting sort), then work items of up to kChunk rows
  std::vector<int64_t> count(num_slots + 1, 0), order;
  for (int64_t t = 0; t < rows; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "lora_delta: slot ", sp[t], " out of range");
    ++count[sp[t] + 1];
  }
  for (int64_t s = 0; s < num_slots; ++s) count[s + 1] += count[s];
  order.resize(rows);
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t t = 0; t < rows; ++t) order[next[sp[t]]++] = t;
  std::vector<Item> items;
  for (int64_t s = 1; s < num_slots; ++s)
    for (int64_t first = count[s]; first < count[s + 1]; first += kChunk)
      items.push_back({s, first, std::min(kChunk, count[s + 1] - first)});
  if (items.empty()) return;
  const std::vector<int64_t> bounds(columns.begin(), columns.end());
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t rank = gr / groups;
  // threads only where each gets enough work to pay its wake-up (~100 us: a prefill, not a decode's few rows per
  // adapter, whose weights' reads are most of its cost); the split changes no bits
  const int64_t cost = (static_cast<int64_t>(rows / items.size()) + 4) * gr * (k + n / groups);
  const int64_t grain = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(1, cost));
  const Scales scales{quantized ? a_scale->data_ptr<float>() : nullptr, quantized ? bt_scale->data_ptr<float>() : nullptr};
  at::parallel_for(0, static_cast<int64_t>(items.size()), grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (wtype == at::kFloat) {
        run_item<float>(items[i], order.data(), xp, k, a.data_ptr<float>(), bt.data_ptr<float>(), scales, gr, rank,
                        bounds, yp, n);
      } else if (wtype == at::kChar) {
        run_item<int8_t>(items[i], order.data(), xp, k, a.data_ptr<int8_t>(), bt.data_ptr<int8_t>(), scales, gr,
                         rank, bounds, yp, n);
      } else {
        run_item<uint16_t>(items[i], order.data(), xp, k, reinterpret_cast<const uint16_t*>(a.data_ptr()),
                           reinterpret_cast<const uint16_t*>(bt.data_ptr()), scales, gr, rank, bounds, yp, n);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlang_cpu, m) {
  m.def("lora_delta(Tensor(a!) y, Tensor x, Tensor a, Tensor bt, Tensor slots, int[] columns, Tensor? a_scale=None, "
        "Tensor? bt_scale=None) -> ()");
}

TORCH_LIBRARY_IMPL(radixlang_cpu, CPU, m) { m.impl("lora_delta", &lora_delta); }
