// radixlang_cpu::dense_mm: y = x W^T in fp32 with one reduction order per output element, whatever the row count;
// built into the same library as block_mm.cpp (block_kernel.py compiles and loads both).
//
// torch's fp32 matmul (MKL / oneDNN) picks its kernel and its blocking of K from the call's shapes: a row's last
// bits then depend on how many rows share the call (a decode batch, a prefill chunk, an extend over a cached
// prefix), so the exact mode's greedy tokens depended on the batch (issue 43). Here the order is fixed per output:
//   lane l (of 16) accumulates x[r, k] * W[n, k] over k = 16 t + l, t = 0, 1, ... with one fused multiply-add
//   each (a partial last vector is zero-padded), then the 16 lanes fold: l + (l + 8), then + 4, + 2, + 1.
// Tiles over rows and output features only (never over K), each output computed whole by one thread, so neither
// the rows around it, nor the tile that holds it, nor the thread count change a bit. The AVX2 build runs the same
// 16 lanes as two 8-lane halves, the same fold: both builds compute the same bits. W stays in the model's own
// [N, K] layout (no packed copy: a tied embedding, a tensor-parallel shard are used as they are).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "lanes16.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

namespace {

using radixlang_cpu_lanes::fold;
using radixlang_cpu_lanes::Lanes16;

#if defined(__AVX512F__)
constexpr int kTileRows = 4, kTileFeatures = 6;  // 24 accumulators, 4 rows and 1 weight vector: 29 of 32 registers
#else
constexpr int kTileRows = 2, kTileFeatures = 2;  // 8 accumulators, 2 rows and 1 weight vector: 14 of 16 registers
#endif

// R rows x F features over all of K: each x vector is loaded once for F features, each W vector once for R rows
template <int R, int F>
inline void tile(const float* x, const float* w, int64_t k, float* y, int64_t n) {
  Lanes16 acc[R][F];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int f = 0; f < F; ++f) acc[r][f] = Lanes16::zero();
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    Lanes16 xv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xv[r] = Lanes16::load(x + r * k + t);
#pragma GCC unroll 8
    for (int f = 0; f < F; ++f) {
      const Lanes16 wv = Lanes16::load(w + f * k + t);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][f] = Lanes16::fma(xv[r], wv, acc[r][f]);
    }
  }
  if (t < k) {
    for (int f = 0; f < F; ++f) {
      const Lanes16 wv = Lanes16::load_part(w + f * k + t, k - t);
      for (int r = 0; r < R; ++r) acc[r][f] = Lanes16::fma(Lanes16::load_part(x + r * k + t, k - t), wv, acc[r][f]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int f = 0; f < F; ++f) y[r * n + f] = fold(acc[r][f]);
}

// features [f, f + F) of rows [0, m), kTileRows rows at a time
template <int F>
void features_of_rows(const float* x, int64_t m, int64_t k, const float* w, float* y, int64_t n) {
  for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
    const float* xr = x + r0 * k;
    float* yr = y + r0 * n;
    switch (std::min<int64_t>(kTileRows, m - r0)) {
#if defined(__AVX512F__)
      case 4: tile<4, F>(xr, w, k, yr, n); break;
      case 3: tile<3, F>(xr, w, k, yr, n); break;
#endif
      case 2: tile<2, F>(xr, w, k, yr, n); break;
      default: tile<1, F>(xr, w, k, yr, n); break;
    }
  }
}

// A block of rows and a block of feature tiles, each about this many bytes, stay in L2 while every tile of one
// runs against every row of the other (a 512-row prefill ran at a third of its speed sweeping all of x, 1.2 MB at
// K = 576, once per tile of 6 features)
constexpr int64_t kBlockBytes = 384 * 1024;  // 128 KB: a 512-row down projection (K = 1536) ran 1.22x slower

// feature tiles [t0, t1) of every row
void run_tiles(const float* x, int64_t m, int64_t k, const float* w, float* y, int64_t n, int64_t t0, int64_t t1) {
  constexpr int64_t F = kTileFeatures;
  const int64_t per_block = std::max<int64_t>(1, kBlockBytes / (4 * k));
  const int64_t rows = std::max<int64_t>(kTileRows, per_block / kTileRows * kTileRows);
  const int64_t tiles = std::max<int64_t>(1, per_block / F);
  for (int64_t b0 = t0; b0 < t1; b0 += tiles) {
    const int64_t b1 = std::min(t1, b0 + tiles);
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
      const int64_t mr = std::min(rows, m - r0);
      const float* xr = x + r0 * k;
      float* yr = y + r0 * n;
      for (int64_t t = b0; t < b1; ++t) {
        const int64_t f0 = t * F;
        if (f0 + F <= n) {
          features_of_rows<F>(xr, mr, k, w + f0 * k, yr + f0, n);
        } else {
          for (int64_t f = f0; f < n; ++f) features_of_rows<1>(xr, mr, k, w + f * k, yr + f, n);
        }
      }
    }
  }
}

at::Tensor dense_mm(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "dense_mm: x must be a 2-D float32 tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "dense_mm: weight must be a contiguous 2-D float32 tensor");
  TORCH_CHECK(weight.size(1) == x.size(1), "dense_mm: x has ", x.size(1), " columns, weight ", weight.size(1));
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), n = weight.size(0);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  if (k == 0) return y.zero_();
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int64_t F = kTileFeatures;
  const int64_t tiles = (n + F - 1) / F;
  // enough tiles per task that a thread's share is worth waking it for (the split changes no bits)
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, F * k * m));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) { run_tiles(xp, m, k, wp, yp, n, t0, t1); });
  return y;
}

// radixlang_cpu::rms_norm and add_rms_norm: RMSNorm over the last dim in the same fixed order, called by the eager
// forward and, as an opaque op, by the compiled one (torch.compile fused the norm into the residual add before it
// and summed in its own order: the compiled decode's logprobs differed from eager's; issue 43). Per row: lane l
// accumulates x[k]^2 over k = 16 t + l with one fused multiply-add each, the lanes fold as dense_mm's do, then
// y[k] = (x[k] * (1 / sqrt(sum / K + eps))) * w[k]. Each row is computed whole by one thread: no bit depends on
// the rows beside it or the thread count. add_rms_norm first writes s = x + delta (one rounding, as torch's add)
// and normalizes s: the residual add and the norm in one pass, as the decoder layer uses them.
// y = x normalized, where x's sum of squares is `acc` (folded here)
inline void scale_row(const float* __restrict x, Lanes16 acc, const float* __restrict w, int64_t k, float eps,
                      float* __restrict y) {
  const float r = 1.0f / std::sqrt(fold(acc) / static_cast<float>(k) + eps);
  for (int64_t i = 0; i < k; ++i) y[i] = (x[i] * r) * w[i];
}

inline void norm_row(const float* __restrict x, const float* __restrict w, int64_t k, float eps, float* __restrict y) {
  Lanes16 acc = Lanes16::zero();
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    const Lanes16 v = Lanes16::load(x + t);
    acc = Lanes16::fma(v, v, acc);
  }
  if (t < k) {
    const Lanes16 v = Lanes16::load_part(x + t, k - t);
    acc = Lanes16::fma(v, v, acc);
  }
  scale_row(x, acc, w, k, eps, y);
}

// s = x + d and its norm y, the sum of squares taken as s is written (the same order as norm_row's on s)
inline void add_norm_row(const float* __restrict x, const float* __restrict d, const float* __restrict w, int64_t k,
                         float eps, float* __restrict s, float* __restrict y) {
  Lanes16 acc = Lanes16::zero();
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    const Lanes16 v = Lanes16::add(Lanes16::load(x + t), Lanes16::load(d + t));
    v.store(s + t);
    acc = Lanes16::fma(v, v, acc);
  }
  if (t < k) {
    const Lanes16 v = Lanes16::add(Lanes16::load_part(x + t, k - t), Lanes16::load_part(d + t, k - t));
    v.store_part(s + t, k - t);
    acc = Lanes16::fma(v, v, acc);
  }
  scale_row(s, acc, w, k, eps, y);
}

void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1, op, ": x must be a float32 tensor");
  TORCH_CHECK(weight.dim() == 1 && weight.scalar_type() == at::kFloat && weight.is_contiguous(), op,
              ": weight must be a contiguous 1-D float32 tensor");
  TORCH_CHECK(weight.size(0) == x.size(-1), op, ": x has ", x.size(-1), " features, weight ", weight.size(0));
}

// rows [0, m) of k features, split over threads by rows only when there are enough of them to be worth it
template <typename RowFn>
void over_rows(int64_t m, int64_t k, const RowFn& row) {
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, k));
  at::parallel_for(0, m, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(r);
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight, "rms_norm");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t k = x.size(-1), m = k == 0 ? 0 : xc.numel() / k;
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  over_rows(m, k, [&](int64_t r) { norm_row(xp + r * k, wp, k, static_cast<float>(eps), yp + r * k); });
  return y;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                                double eps) {
  check_norm(x, weight, "add_rms_norm");
  TORCH_CHECK(delta.sizes() == x.sizes() && delta.scalar_type() == at::kFloat,
              "add_rms_norm: delta must be a float32 tensor of x's shape");
  const at::Tensor xc = x.contiguous(), dc = delta.contiguous();
  at::Tensor s = at::empty(x.sizes(), x.options()), y = at::empty(x.sizes(), x.options());
  const int64_t k = x.size(-1), m = k == 0 ? 0 : xc.numel() / k;
  const float* xp = xc.data_ptr<float>();
  const float* dp = dc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  over_rows(m, k, [&](int64_t r) {
    add_norm_row(xp + r * k, dp + r * k, wp, k, static_cast<float>(eps), sp + r * k, yp + r * k);
  });
  return {s, y};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlang_cpu, m) {
  m.def("dense_mm(Tensor x, Tensor weight) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixlang_cpu, CPU, m) {
  m.impl("dense_mm", &dense_mm);
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
}
