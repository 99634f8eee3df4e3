// radixlang_cpu::block_mm: y = x W^T for W held as a GGUF's own 32-weight blocks (Q4_0 / Q4_1 / Q8_0), on
// integer dot products; built and loaded by block_kernel.py (see its docstring for the design).
//
// Two weight layouts, told apart by qweight's rank.
// Rows (2-D qweight; AVX2 `maddubs` / AVX-VNNI), per output feature n and block b of 32 input columns:
//   bits 4: qweight uint8 [N, K / 2], 16 bytes a block, byte j = code j (low nibble) | code j + 16 (high
//           nibble), codes in [0, 15] (ggml's Q4_0 / Q4_1 order); W = scale * code + minimum
//   bits 8: qweight int8 [N, K], codes in [-128, 127]; W = scale * code (minimum unused)
//   scale, minimum: fp32 [N, K / 32]
// Interleaved (3-D qweight; AVX-512 VNNI, compiled where the CPU has it): 16 output features side by side, so
// one 512-bit `dpbusd` takes 4 inputs of 16 features and each feature's sum stays in its own lane (no
// horizontal sums, one weight stream per thread). G = N / 16 groups; per group g and block b:
//   bits 4: qweight uint8 [G, K / 32, 256]: byte i * 64 + f * 4 + j = code(16 g + f, 32 b + 4 i + j) (low nibble)
//           | code(16 g + f, 32 b + 16 + 4 i + j) (high nibble), i < 4, j < 4
//   bits 8: qweight int8 [G, K / 32, 512]: byte i * 64 + f * 4 + j = code(16 g + f, 32 b + 4 i + j), i < 8
//   scale: fp16 [G, K / 32, 16] (a GGUF stores its scales and minimums in fp16: exact, and a quarter fewer bytes
//   than fp32 per 4-bit block); minimum: bits 4 fp16 [G, K / 32, 16], bits 8 int16 [G, K / 32, 16] = the block's
//   sum of codes (dpbusd multiplies unsigned by signed bytes: Q8_0's signed codes take the activations shifted
//   to q + 128, and 128 * this exact integer takes the shift back out)
// Activations (the documented rule the tests' oracle repeats): per row and block of 32, amax = max |x|,
//   d = amax / 127, q = round_half_even(x * (127 / amax)) in [-127, 127] (all 0 where amax = 0), s = d * sum(q).
// Then y[r, n] = sum_b scale[n, b] * d[r, b] * (sum_i code_i * q_i) + minimum[n, b] * s[r, b]: the integer sums
// are exact, the float sums accumulate per block.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int kMaxRows = 4;  // rows sharing one unpacked weight block (register tile)
constexpr int kFeatures = 4;  // output features of a register tile, and of a parallel task's unit

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 int32 sums of 4 products each, u8 x s8 (no int16 saturation here: |code * q| sums stay below 2^15)
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// one row's blocks: codes q, scales d, and d * sum(q) per block
void quantize_row(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / kGroup; ++b) {
    const float* src = x + b * kGroup;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(src + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float top = _mm_cvtss_f32(m);
    const __m256 inv = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    __m256i c[4];
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {  // cvtps rounds by MXCSR: to nearest, ties to even
      c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      sum = _mm256_add_epi32(sum, c[i]);
    }
    // pack 32 int32 -> 32 int8; the packs interleave 128-bit lanes, the permute restores the order
    const __m256i p16a = _mm256_packs_epi32(c[0], c[1]);
    const __m256i p16b = _mm256_packs_epi32(c[2], c[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kGroup), ordered);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_hadd_epi32(t, t);
    t = _mm_hadd_epi32(t, t);
    d[b] = top / 127.0f;
    s[b] = d[b] * static_cast<float>(_mm_cvtsi128_si32(t));
  }
}

inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float out = hsum(acc);
  for (; i < n; ++i) out += a[i] * b[i];
  return out;
}

// R rows x F output features: each weight block is unpacked once and dotted with R activation rows; the R * F
// accumulators are independent, so the FMAs of consecutive blocks do not wait on each other
template <int Bits, int R, int F>
inline void tile(const uint8_t* w, int64_t row_bytes, const float* wd, int64_t kb, const int8_t* q, const float* xd,
                 int64_t k, float* acc_out) {
  __m256 acc[R][F];
  for (int r = 0; r < R; ++r)
    for (int f = 0; f < F; ++f) acc[r][f] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < kb; ++b) {
    __m256i xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * k + b * kGroup));
    for (int f = 0; f < F; ++f) {
      const uint8_t* wf = w + f * row_bytes;
      __m256i wu;  // unsigned operand of the dot
      __m256i ws;  // Q8_0: the weights' signs, moved onto the activations
      if constexpr (Bits == 4) {
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wf + b * 16));
        wu = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
        ws = wu;
      } else {
        ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wf + b * kGroup));
        wu = _mm256_sign_epi8(ws, ws);  // |code|; -128 stays 0x80, which is 128 unsigned
      }
      const float dw = wd[f * kb + b];
      for (int r = 0; r < R; ++r) {
        const __m256i x = Bits == 8 ? _mm256_sign_epi8(xv[r], ws) : xv[r];
        const __m256 prod = _mm256_cvtepi32_ps(dot_u8s8(wu, x));
        acc[r][f] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[r * kb + b]), prod, acc[r][f]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int f = 0; f < F; ++f) acc_out[r * F + f] = hsum(acc[r][f]);
}

// features [f0, f0 + F) of every row, R rows at a time
template <int Bits, int F>
void run_features(const uint8_t* w, int64_t row_bytes, const float* wd, const float* wm, int64_t kb,
                  const int8_t* q, const float* xd, const float* xs, int64_t m, int64_t k, float* y,
                  int64_t n_total, int64_t f0) {
  constexpr int kRows = F >= kFeatures ? 2 : kMaxRows;  // R * F accumulators within the 16 registers
  float sums[kRows * F];
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, m - r0);
    const int8_t* qr = q + r0 * k;
    const float* dr = xd + r0 * kb;
    switch (rows) {
      case 4: tile<Bits, 4, F>(w, row_bytes, wd, kb, qr, dr, k, sums); break;
      case 3: tile<Bits, 3, F>(w, row_bytes, wd, kb, qr, dr, k, sums); break;
      case 2: tile<Bits, 2, F>(w, row_bytes, wd, kb, qr, dr, k, sums); break;
      default: tile<Bits, 1, F>(w, row_bytes, wd, kb, qr, dr, k, sums); break;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int f = 0; f < F; ++f) {
        float v = sums[r * F + f];
        if constexpr (Bits == 4) v += dot_f32(wm + f * kb, xs + (r0 + r) * kb, kb);
        y[(r0 + r) * n_total + f0 + f] = v;
      }
  }
}

template <int Bits>
void run_range(const uint8_t* wp, int64_t row_bytes, const float* sp, const float* mp, int64_t kb, const int8_t* q,
               const float* xd, const float* xs, int64_t m, int64_t k, float* y, int64_t n, int64_t f0, int64_t f1) {
  constexpr int F = kFeatures;
  int64_t f = f0;
  for (; f + F <= f1; f += F)
    run_features<Bits, F>(wp + f * row_bytes, row_bytes, sp + f * kb, Bits == 4 ? mp + f * kb : nullptr, kb, q, xd,
                          xs, m, k, y, n, f);
  for (; f < f1; ++f)
    run_features<Bits, 1>(wp + f * row_bytes, row_bytes, sp + f * kb, Bits == 4 ? mp + f * kb : nullptr, kb, q, xd,
                          xs, m, k, y, n, f);
}

constexpr int kLanes = 16;  // output features of an interleaved group: one 512-bit register of fp32 / int32 sums
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr bool kInterleaved = true;
constexpr int kTileRows = 8;  // activation rows sharing one unpacked block (8 accumulators + 8 weight registers)

// R rows x one group of 16 features over all blocks: acc[r] holds y[r, 16 g .. 16 g + 15]
inline __m512 load_halves(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// A decode step's weights come from memory, not the caches (SmolLM2's layers are 66 MB), and each layer's call
// starts a fresh stream that the hardware prefetcher picks up late and drops at every 4 KB page. Asking for the
// block 4 KB ahead (and its scales) kept the stream going: 30 layers' calls at 1 row 3.50 against 4.03 ms (best of
// 3 interleaved runs), a compiled batch-1 step 1.11x (step_profile --baseline, 2026-12-04, a 2-core Xeon VM with
// AVX-512 VNNI; 512 and 1024 bytes ahead were no faster than none). Prefetching past the end is harmless: no fault.
constexpr int64_t kPrefetchBytes = 4096;

template <int64_t BlockBytes>
inline void prefetch_ahead(const uint8_t* wb, const uint16_t* ws, const uint16_t* wm) {
  for (int64_t line = 0; line < BlockBytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(wb + kPrefetchBytes + line), _MM_HINT_T0);
  constexpr int64_t ahead = kPrefetchBytes / BlockBytes * kLanes;  // their scales and minimums, 16 bits each
  _mm_prefetch(reinterpret_cast<const char*>(ws + ahead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(wm + ahead), _MM_HINT_T0);
}

template <int Bits, int R>
inline void group_tile(const uint8_t* w, const uint16_t* ws, const uint16_t* wm, int64_t kb, const int8_t* q,
                       int64_t k, const float* xd, const float* xs, float* y, int64_t n) {
  constexpr int kBlockBytes = Bits == 4 ? 256 : 512;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i shift = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* wb = w + b * kBlockBytes;
    prefetch_ahead<kBlockBytes>(wb, ws + b * kLanes, wm + b * kLanes);
    __m512i wv[8];
    if constexpr (Bits == 4) {
      for (int i = 0; i < 4; ++i) {
        const __m512i packed = _mm512_loadu_si512(wb + i * 64);
        wv[i] = _mm512_and_si512(packed, low);
        wv[i + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
      }
    } else {
      for (int i = 0; i < 8; ++i) wv[i] = _mm512_loadu_si512(wb + i * 64);
    }
    const __m512 dw = load_halves(ws + b * kLanes);
    const __m512 mw = Bits == 4 ? load_halves(wm + b * kLanes) : _mm512_setzero_ps();
#pragma GCC unroll 8  // acc[] then stays in registers (not unrolled, GCC kept it on the stack)
    for (int r = 0; r < R; ++r) {
      const int32_t* qr = reinterpret_cast<const int32_t*>(q + r * k + b * kGroup);
      __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();  // two chains: half the latency
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        if constexpr (Bits == 4) {  // unsigned codes x signed activations
          dot0 = _mm512_dpbusd_epi32(dot0, wv[i], _mm512_set1_epi32(qr[i]));
          dot1 = _mm512_dpbusd_epi32(dot1, wv[i + 4], _mm512_set1_epi32(qr[i + 4]));
        } else {  // activations + 128 (unsigned) x signed codes
          dot0 = _mm512_dpbusd_epi32(dot0, _mm512_xor_si512(_mm512_set1_epi32(qr[i]), shift), wv[i]);
          dot1 = _mm512_dpbusd_epi32(dot1, _mm512_xor_si512(_mm512_set1_epi32(qr[i + 4]), shift), wv[i + 4]);
        }
      }
      __m512i dot = _mm512_add_epi32(dot0, dot1);
      if constexpr (Bits == 8) {
        const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wm + b * kLanes));
        dot = _mm512_sub_epi32(dot, _mm512_slli_epi32(_mm512_cvtepi16_epi32(sums), 7));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r * kb + b])), acc[r]);
      if constexpr (Bits == 4)
        acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[r * kb + b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * n, acc[r]);
}

// groups [g0, g1) of every row, kTileRows rows at a time (a group's weights stay in L1 / L2 across the tiles)
template <int Bits>
void run_groups(const uint8_t* w, const uint16_t* ws, const uint16_t* wm, int64_t kb, const int8_t* q, int64_t k,
                const float* xd, const float* xs, int64_t m, float* y, int64_t n, int64_t g0, int64_t g1) {
  constexpr int64_t kBlockBytes = Bits == 4 ? 256 : 512;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* wg = w + g * kb * kBlockBytes;
    const uint16_t* sg = ws + g * kb * kLanes;
    const uint16_t* mg = wm + g * kb * kLanes;
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const int8_t* qr = q + r0 * k;
      const float* dr = xd + r0 * kb;
      const float* sr = xs + r0 * kb;
      float* yr = y + r0 * n + g * kLanes;
      switch (std::min<int64_t>(kTileRows, m - r0)) {
        case 8: group_tile<Bits, 8>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        case 7: group_tile<Bits, 7>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        case 6: group_tile<Bits, 6>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        case 5: group_tile<Bits, 5>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        case 4: group_tile<Bits, 4>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        case 3: group_tile<Bits, 3>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        case 2: group_tile<Bits, 2>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
        default: group_tile<Bits, 1>(wg, sg, mg, kb, qr, k, dr, sr, yr, n); break;
      }
    }
  }
}
#else
constexpr bool kInterleaved = false;
#endif

// x quantized per row and block of 32 (the rule above): codes q [m, k], scales d and d * sum(q) [m, k / 32]
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

QuantizedRows quantize_rows(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), kb = k / kGroup;
  QuantizedRows out{std::vector<int8_t>(m * k), std::vector<float>(m * kb), std::vector<float>(m * kb)};
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row(xp + r * k, k, out.q.data() + r * k, out.d.data() + r * kb, out.s.data() + r * kb);
  });
  return out;
}

void check_common(const at::Tensor& x, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "block_mm: bits must be 4 or 8, got ", bits);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "block_mm: x must be a 2-D float32 tensor");
  TORCH_CHECK(x.size(1) % kGroup == 0, "block_mm: in_features must be a multiple of 32, got ", x.size(1));
}

at::Tensor block_mm_rows(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                         const at::Tensor& minimum, int64_t bits) {
  const int64_t m = x.size(0), k = x.size(1), n = qweight.size(0), kb = k / kGroup;
  TORCH_CHECK(qweight.size(1) == (bits == 4 ? k / 2 : k) && qweight.element_size() == 1 && qweight.is_contiguous(),
              "block_mm: qweight must be a contiguous 1-byte [N, ", bits == 4 ? k / 2 : k, "] tensor");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == n * kb,
              "block_mm: scale must be a contiguous float32 [N, K / 32] tensor");
  TORCH_CHECK(bits == 8 || (minimum.scalar_type() == at::kFloat && minimum.is_contiguous() &&
                            minimum.numel() == n * kb),
              "block_mm: minimum must be a contiguous float32 [N, K / 32] tensor");
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const QuantizedRows xq = quantize_rows(x);
  const uint8_t* wp = static_cast<const uint8_t*>(qweight.data_ptr());
  const float* sp = scale.data_ptr<float>();
  const float* mp = bits == 4 ? minimum.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t row_bytes = bits == 4 ? k / 2 : k;
  // tasks of whole 4-feature tiles, enough of them that a thread's share is worth waking it for
  const int64_t tiles = (n + kFeatures - 1) / kFeatures;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, k * m));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    const int64_t f0 = t0 * kFeatures, f1 = std::min(n, t1 * kFeatures);
    if (bits == 4)
      run_range<4>(wp, row_bytes, sp, mp, kb, xq.q.data(), xq.d.data(), xq.s.data(), m, k, yp, n, f0, f1);
    else
      run_range<8>(wp, row_bytes, sp, nullptr, kb, xq.q.data(), xq.d.data(), xq.s.data(), m, k, yp, n, f0, f1);
  });
  return y;
}

at::Tensor block_mm_interleaved(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                                const at::Tensor& minimum, int64_t bits) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  const int64_t m = x.size(0), k = x.size(1), kb = k / kGroup, groups = qweight.size(0), n = groups * kLanes;
  const int64_t block_bytes = bits == 4 ? 256 : 512;
  TORCH_CHECK(qweight.size(1) == kb && qweight.size(2) == block_bytes && qweight.element_size() == 1 &&
                  qweight.is_contiguous(),
              "block_mm: an interleaved qweight must be a contiguous 1-byte [N / 16, K / 32, ", block_bytes, "] tensor");
  TORCH_CHECK(scale.scalar_type() == at::kHalf && scale.is_contiguous() && scale.numel() == n * kb,
              "block_mm: an interleaved scale must be a contiguous float16 [N / 16, K / 32, 16] tensor");
  TORCH_CHECK(minimum.scalar_type() == (bits == 4 ? at::kHalf : at::kShort) && minimum.is_contiguous() &&
                  minimum.numel() == n * kb,
              "block_mm: an interleaved minimum must be a contiguous [N / 16, K / 32, 16] tensor, float16 for 4 bits, "
              "int16 (the block's sum of codes) for 8");
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const QuantizedRows xq = quantize_rows(x);
  const uint8_t* wp = static_cast<const uint8_t*>(qweight.data_ptr());
  const uint16_t* sp = static_cast<const uint16_t*>(scale.data_ptr());
  const uint16_t* mp = static_cast<const uint16_t*>(minimum.data_ptr());
  float* yp = y.data_ptr<float>();
  // a task is a group of 16 features; enough groups per task that a thread's share is worth waking it for
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, kLanes * k * m));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    if (bits == 4)
      run_groups<4>(wp, sp, mp, kb, xq.q.data(), k, xq.d.data(), xq.s.data(), m, yp, n, g0, g1);
    else
      run_groups<8>(wp, sp, mp, kb, xq.q.data(), k, xq.d.data(), xq.s.data(), m, yp, n, g0, g1);
  });
  return y;
#else
  TORCH_CHECK(false, "block_mm: the interleaved layout needs AVX-512 VNNI, which this build lacks");
#endif
}

at::Tensor block_mm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                    const at::Tensor& minimum, int64_t bits) {
  check_common(x, bits);
  TORCH_CHECK(qweight.dim() == 2 || qweight.dim() == 3, "block_mm: qweight must be 2-D (rows) or 3-D (interleaved)");
  const at::Tensor xc = x.contiguous();
  return qweight.dim() == 3 ? block_mm_interleaved(xc, qweight, scale, minimum, bits)
                            : block_mm_rows(xc, qweight, scale, minimum, bits);
}


// ---- radixlang_cpu::attention_rows: softmax attention of each query row over its own visible keys, in one fixed
// order. A row's result depends on its query, its keys and their count only: not on how many rows share the call
// (a decode batch, a prefill chunk), on padding, nor on how its keys were split between cached and new tokens, so
// an extend over a cached prefix, a cold prefill and a decode compute the same bits (torch's SDPA tiles the
// queries and keys by the call's shapes). Per (row, head), on 8-lane AVX2 vectors (the same code on AVX-512 CPUs):
//   s_j = scale * q . k_j   (lanes over the head dim, i = 8 t + l, summed lane-wise then by a fixed tree)
//   p_j = exp(s_j - max s)  (a fixed polynomial, below), sum = lanes over j, l = j mod 8, then the same tree
//   o = (sum_j p_j v_j in j order) / sum
// Each (row, head) is one task on one thread: the thread count changes nothing.

inline float hsum8(__m256 v) { return hsum(v); }

// exp(x) for x <= 0 (Cephes' polynomial on x - n ln 2, then 2^n through the exponent bits); below -87.3: 0
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 floor_x = _mm256_set1_ps(-87.3f);
  const __m256 zero_mask = _mm256_cmp_ps(x, floor_x, _CMP_LT_OQ);
  x = _mm256_max_ps(x, floor_x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_mask, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// The caches' rows as fp32 lanes, 8 (load8) or 16 (load16) at a time: fp32 as stored, or a quantized KV cache's
// codes (kernels/kv_quant.py) widened exactly (int8 -> int32 -> fp32; e4m3 through fp16, below) to kUnit^-1 times
// their values. A quantized row's scale times kUnit (a power of two: exact) then multiplies the row's dot product
// (K) or its softmax weight (V): code * scale summed is the dequantized row's sum up to the fp32 rounding, the same
// for every row whatever its batch.
struct Fp32Rows {
  using Code = float;
  static constexpr float kUnit = 1.0f;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static void load16(const float* p, __m256& lo, __m256& hi) { lo = load8(p), hi = load8(p + 8); }
};

struct Int8Rows {
  using Code = int8_t;
  static constexpr float kUnit = 1.0f;
  static __m256 load8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void load16(const int8_t* p, __m256& lo, __m256& hi) { lo = load8(p), hi = load8(p + 8); }
};

// float8_e4m3fn (sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities) is fp16's layout with one
// exponent bit fewer: its bits moved into an fp16's (sign to bit 15, exponent and mantissa to bits 13..7) are the
// half-precision number 2^-8 times the code's value, subnormals included, and F16C converts it exactly (kUnit 2^8
// restores the value in the row's factor). 16 codes share each integer step. A 256-entry table read by AVX2's
// gather gave the same values, but the gather is microcoded on AMD's cores: decodes over a 2.4k-token e4m3 cache
// ran at 0.36-0.63x the fp32 cache's speed (benchmark/kv_cache_dtype.py). The NaN codes (0x7F, 0xFF) would read
// as +-480; kv_quant.quantize never writes them (it saturates at 448).
struct E4m3Rows {
  using Code = uint8_t;
  static constexpr float kUnit = 256.0f;
  static __m256i halves(__m256i bits) {  // bits: codes in 16-bit lanes
    return _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(bits, 7), _mm256_set1_epi16(0x3F80)),
                           _mm256_and_si256(_mm256_slli_epi16(bits, 8), _mm256_set1_epi16(-0x8000)));
  }
  static __m256 load8(const uint8_t* p) {
    const __m256i bits = _mm256_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(halves(bits)));
  }
  static void load16(const uint8_t* p, __m256& lo, __m256& hi) {
    const __m256i half = halves(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(half)), hi = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
  }
};

// k_scale, v_scale: [S, KH] fp16 scales of a quantized cache, or nullptr (fp32 rows: the factor is 1, exact)
template <typename Rows>
void attend_row(const float* q, const typename Rows::Code* k_cache, const typename Rows::Code* v_cache,
                const at::Half* k_scale, const at::Half* v_scale, int64_t kv_heads, int64_t kv_head, int64_t d,
                const int64_t* slots, int64_t len, float scale, float* scores, float* out) {
  using Code = typename Rows::Code;
  const int64_t vecs = d / 8, slot_stride = kv_heads * d;
  const float* qh = q;
  auto row = [&](const Code* cache, int64_t j) { return cache + slots[j] * slot_stride + kv_head * d; };
  auto factor = [&](const at::Half* scales, int64_t j) {
    return scales == nullptr ? 1.0f : static_cast<float>(scales[slots[j] * kv_heads + kv_head]) * Rows::kUnit;
  };
  // a + q . k over vectors [t, t + 2) or [t, t + 1) of the head dim, each lane's terms in t order
  auto dot2 = [&](const Code* k, int64_t t, __m256 a) {
    __m256 lo, hi;
    Rows::load16(k + 8 * t, lo, hi);
    return _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * t + 8), hi, _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * t), lo, a));
  };
  auto dot1 = [&](const Code* k, int64_t t, __m256 a) {
    return _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * t), Rows::load8(k + 8 * t), a);
  };
  // scores, 4 keys at a time for independent FMA chains (each key's own order is the same)
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    const Code *k0 = row(k_cache, j), *k1 = row(k_cache, j + 1), *k2 = row(k_cache, j + 2), *k3 = row(k_cache, j + 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 2 <= vecs; t += 2) a0 = dot2(k0, t, a0), a1 = dot2(k1, t, a1), a2 = dot2(k2, t, a2), a3 = dot2(k3, t, a3);
    if (t < vecs) a0 = dot1(k0, t, a0), a1 = dot1(k1, t, a1), a2 = dot1(k2, t, a2), a3 = dot1(k3, t, a3);
    scores[j] = hsum8(a0) * factor(k_scale, j) * scale;
    scores[j + 1] = hsum8(a1) * factor(k_scale, j + 1) * scale;
    scores[j + 2] = hsum8(a2) * factor(k_scale, j + 2) * scale;
    scores[j + 3] = hsum8(a3) * factor(k_scale, j + 3) * scale;
  }
  for (; j < len; ++j) {
    const Code* k0 = row(k_cache, j);
    __m256 a0 = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 2 <= vecs; t += 2) a0 = dot2(k0, t, a0);
    if (t < vecs) a0 = dot1(k0, t, a0);
    scores[j] = hsum8(a0) * factor(k_scale, j) * scale;
  }
  float top = scores[0];
  for (int64_t i = 1; i < len; ++i) top = std::max(top, scores[i]);
  // p_j in place; the sum over lanes j mod 8, the tail (j >= 8 * (len / 8)) padded with zeros into one more vector
  const __m256 topv = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + i), topv));
    _mm256_storeu_ps(scores + i, p);
    sum = _mm256_add_ps(sum, p);
  }
  if (i < len) {
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t t = i; t < len; ++t) tail[t - i] = scores[t] - top;
    __m256 p = exp_nonpositive(_mm256_load_ps(tail));
    p = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(len - i)),
                                                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
    _mm256_store_ps(tail, p);
    for (int64_t t = i; t < len; ++t) scores[t] = tail[t - i];
    sum = _mm256_add_ps(sum, p);
  }
  const float inv = 1.0f / hsum8(sum);
  // o = sum_j p_j v_j, j in order, 8 head-dim lanes per vector (d <= 256: 32 vectors held on the stack)
  __m256 acc[32];
  for (int64_t t = 0; t < vecs; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t jj = 0; jj < len; ++jj) {
    const Code* v0 = row(v_cache, jj);
    const __m256 p = _mm256_set1_ps(scores[jj] * factor(v_scale, jj));
    int64_t t = 0;
    for (; t + 2 <= vecs; t += 2) {
      __m256 lo, hi;
      Rows::load16(v0 + 8 * t, lo, hi);
      acc[t] = _mm256_fmadd_ps(p, lo, acc[t]), acc[t + 1] = _mm256_fmadd_ps(p, hi, acc[t + 1]);
    }
    if (t < vecs) acc[t] = _mm256_fmadd_ps(p, Rows::load8(v0 + 8 * t), acc[t]);
  }
  const __m256 invv = _mm256_set1_ps(inv);
  for (int64_t t = 0; t < vecs; ++t) _mm256_storeu_ps(out + 8 * t, _mm256_mul_ps(acc[t], invv));
}

template <typename Rows>
void attend_rows(const at::Tensor& qc, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Half* ks,
                 const at::Half* vs, const at::Tensor& slots, const int64_t* off, const int64_t* lens, int64_t longest,
                 float scale, at::Tensor& out) {
  const int64_t n = qc.size(0), heads = qc.size(1), d = qc.size(2), kv_heads = k_cache.size(1);
  const int64_t groups = heads / kv_heads;
  const float* qp = qc.data_ptr<float>();
  const auto* kp = static_cast<const typename Rows::Code*>(k_cache.data_ptr());
  const auto* vp = static_cast<const typename Rows::Code*>(v_cache.data_ptr());
  const int64_t* sp = slots.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n * heads, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> scores(longest + 8);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t r = u / heads, h = u % heads;
      attend_row<Rows>(qp + u * d, kp, vp, ks, vs, kv_heads, h / groups, d, sp + off[r], lens[r], scale, scores.data(),
                       op + u * d);
    }
  });
}

// q [n, H, d]; k_cache, v_cache [S, KH, d]; row r attends over slots[row_offset[r] : row_offset[r] + row_len[r]].
// The caches are fp32, or (with k_scale, v_scale: fp16 [S, KH]) int8 / float8_e4m3fn codes
at::Tensor attention_rows(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& slots, const at::Tensor& row_offset, const at::Tensor& row_len,
                          double scale, const std::optional<at::Tensor>& k_scale,
                          const std::optional<at::Tensor>& v_scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, "attention_rows: q must be a float32 [n, heads, d] tensor");
  const bool quantized = k_scale.has_value();
  const auto codes = k_cache.scalar_type();
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.scalar_type() == codes && v_cache.is_contiguous(),
              "attention_rows: the caches must be contiguous [slots, kv_heads, d] tensors of one shape and dtype");
  TORCH_CHECK(quantized ? (codes == at::kChar || codes == at::kFloat8_e4m3fn) : codes == at::kFloat,
              "attention_rows: the caches must be float32, or int8 / float8_e4m3fn with their scales");
  TORCH_CHECK(quantized == v_scale.has_value(), "attention_rows: k_scale and v_scale come together");
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == d && d % 8 == 0 && d <= 256, "attention_rows: head dim must match, a multiple of 8, <= 256");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "attention_rows: heads must be a multiple of kv_heads");
  if (quantized) {
    for (const at::Tensor* s : {&*k_scale, &*v_scale})
      TORCH_CHECK(s->scalar_type() == at::kHalf && s->is_contiguous() && s->dim() == 2 &&
                      s->size(0) == k_cache.size(0) && s->size(1) == kv_heads,
                  "attention_rows: the scales must be contiguous float16 [slots, kv_heads] tensors");
  }
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && row_offset.scalar_type() == at::kLong &&
                  row_len.scalar_type() == at::kLong && row_offset.numel() == n && row_len.numel() == n &&
                  row_offset.is_contiguous() && row_len.is_contiguous(),
              "attention_rows: slots, row_offset and row_len must be contiguous int64, one offset and length a row");
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty({n, heads, d}, q.options());
  if (n == 0) return out;
  const int64_t* off = row_offset.data_ptr<int64_t>();
  const int64_t* lens = row_len.data_ptr<int64_t>();
  const int64_t total = slots.numel();
  int64_t longest = 0;
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(lens[r] > 0 && off[r] >= 0 && off[r] + lens[r] <= total, "attention_rows: row ", r,
                " reaches past its slots");
    longest = std::max(longest, lens[r]);
  }
  const float sc = static_cast<float>(scale);
  const at::Half* ks = quantized ? k_scale->data_ptr<at::Half>() : nullptr;
  const at::Half* vs = quantized ? v_scale->data_ptr<at::Half>() : nullptr;
  if (codes == at::kFloat)
    attend_rows<Fp32Rows>(qc, k_cache, v_cache, nullptr, nullptr, slots, off, lens, longest, sc, out);
  else if (codes == at::kChar)
    attend_rows<Int8Rows>(qc, k_cache, v_cache, ks, vs, slots, off, lens, longest, sc, out);
  else
    attend_rows<E4m3Rows>(qc, k_cache, v_cache, ks, vs, slots, off, lens, longest, sc, out);
  return out;
}

// 16 where this build runs the interleaved layout (AVX-512 VNNI), else 0: the loader packs weights to match
int64_t block_mm_interleave() { return kInterleaved ? kLanes : 0; }

}  // namespace

TORCH_LIBRARY(radixlang_cpu, m) {
  m.def("block_mm(Tensor x, Tensor qweight, Tensor scale, Tensor minimum, int bits) -> Tensor");
  m.def("block_mm_interleave() -> int", &block_mm_interleave);
  m.def("attention_rows(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor row_offset, Tensor row_len, "
        "float scale, Tensor? k_scale=None, Tensor? v_scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlang_cpu, CPU, m) {
  m.impl("block_mm", &block_mm);
  m.impl("attention_rows", &attention_rows);
}
