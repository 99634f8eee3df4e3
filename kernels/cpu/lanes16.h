// 16 fp32 lanes, the unit of the fixed-order CPU kernels (dense_mm.cpp: matmul and norms, lora_mm.cpp): one 512-bit register with
// AVX-512, two 256-bit halves with AVX2. Both builds compute each lane with the same fused multiply-adds and fold
// the 16 lanes in the same order (fold below), so they give the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace radixlang_cpu_lanes {

#if defined(__AVX512F__)
struct Lanes16 {
  __m512 v;
  static Lanes16 zero() { return {_mm512_setzero_ps()}; }
  static Lanes16 all(float s) { return {_mm512_set1_ps(s)}; }
  static Lanes16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  // bf16 -> fp32 is exact: the 16 bits become the float's high half
  static Lanes16 load(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
  }
  static Lanes16 load(const int8_t* p) {  // int8 -> fp32, exact
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
  }
  static Lanes16 load_part(const float* p, int64_t n) {
    return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p)};
  }
  static Lanes16 fma(Lanes16 a, Lanes16 b, Lanes16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  static Lanes16 add(Lanes16 a, Lanes16 b) { return {_mm512_add_ps(a.v, b.v)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store_part(float* p, int64_t n) const { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v); }
  __m256 fold8() const {  // lane l + lane l + 8
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
};
#else
struct Lanes16 {
  __m256 lo, hi;
  static Lanes16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Lanes16 all(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
  static Lanes16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Lanes16 load(const uint16_t* p) {
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
  }
  static Lanes16 load(const int8_t* p) {
    const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    return {_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)};
  }
  static Lanes16 load_part(const float* p, int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
    const __m256i hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n) - 8), idx);
    return {_mm256_maskload_ps(p, lo), _mm256_maskload_ps(p + 8, hi)};
  }
  static Lanes16 fma(Lanes16 a, Lanes16 b, Lanes16 c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static Lanes16 add(Lanes16 a, Lanes16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  void store(float* p) const {
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
  }
  void store_part(float* p, int64_t n) const {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx), lo);
    _mm256_maskstore_ps(p + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n) - 8), idx), hi);
  }
  __m256 fold8() const { return _mm256_add_ps(lo, hi); }
};
#endif

// the fold of the 16 lanes to one sum: (l + l + 8), then + 4, + 2, + 1
inline float fold(Lanes16 a) {
  const __m256 v = a.fold8();
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace radixlang_cpu_lanes
