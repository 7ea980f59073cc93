"""Compiled CPU kernels for relative attention (inference, and training's forward) and for training's dropout, built
on first use with the machine's C++ compiler.

`relative_attention_by_query_blocks` (kernels_txl.py) computes a long segment's attention a block of queries at a
time with torch operators: about five parallel regions per block, where transformers' GPT-2 makes one SDPA call a
layer. On a small model at batch 1 those regions' fork and join are a measurable share of a prefill, and on a busy
machine a late thread stretches each of them (docs/performance-log.md). The kernel here computes the same attention in
one parallel region a layer, one (sequence, head) per task, the way a flash-attention kernel does, with the relative
shift inside:

    for each block of 16 queries i of a head:
        s[i, j] = ((q_i + u) . k_j + (q_i + v) . r_{M+i-j}) * scaling     for the keys j <= M + i only
        p[i, :] = softmax(s[i, :] + mask)                                   (exp vectorised, in cache)
        out[i]  = p[i, :] @ v

where r_{M+i-j} = W_{k,R} R at distance M + i - j: with the relative keys transposed to `[D, K]`, query i's row of
them is column j + Q - 1 - i, so the shift is an offset per query and no score is computed twice (the torch path
computes a padded product and views it shifted). Decoding (one query per sequence) has its own loop: one call a
layer for the six of `kernels_txl.one_query_attention`, each key's row read in place. Training takes the same
forward, which then also writes p (`[H B, Q, K]`, zeros past the keys a query sees) for the backward of
`kernels_txl._relative_attention_backward`, whose score gradient dS = p (dO v^T - dO . o) is one pass of a kernel here
(`relative_attention_score_grad`), written in the padded layout the position products read; its matrix products
are torch's. Values equal the readable path's within float32 rounding (tests).

The score products are register-blocked like a matrix product's micro-kernel: a group of 8 query rows (4 with 16
registers) times two vectors of keys, one broadcast per row and width index. The relative shift makes each row read
the relative keys at its own offset, so the position scores of a group are one product over the columns from its
last row's offset, kept in a buffer; the content product then adds each row's shifted slice. Vectors are 16 floats
where the build has AVX-512, else 8.

Dropout draws its mask from a counter-based stream (splitmix64: word n depends only on the seed and n), so each
thread draws its own part of the mask in the same pass that multiplies the inputs (and applies the ReLU before the
feed-forward's second product); `kernels_txl._keep_mask` computes the same stream with torch operators, and the two
agree bit for bit (tests).

Built once per machine, torch version and CPU capability into ~/.cache/transfoxl/kernels (or $TRANSFOXL_KERNEL_CACHE),
about 10 s; on Linux x86-64 with AVX2 and a C++ compiler (`$CXX`, else `c++`) only. Elsewhere, with
TRANSFOXL_CPU_KERNEL=0, or if the build fails (logged once), `compiled_operators()` returns None and the model
uses the torch path. This file imports torch, transformers' logging and the standard library: `save_pretrained`
copies it into a model folder with kernels_txl.py, so remote code builds the same kernel.

Shapes, in modeling_txl.py's legend: B batch, H heads, Q queries (segment), M memory, K = M + Q keys, D head width.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// Eight floats in an AVX2 register. Rows per micro-kernel call: 4 where AVX-512VL gives 32 such registers, else 2
// (4-row tiles would spill on 16 registers).
struct Vec {
  static constexpr int W = 8;
#if defined(__AVX512VL__)
  static constexpr int TR = 4;
#else
  static constexpr int TR = 2;
#endif
  __m256 v;
  static Vec zero() { return {_mm256_setzero_ps()}; }
  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vec bcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  friend Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  friend Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
  friend Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
  friend Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
  float sum() const;  // (below: horizontal_sum)
};
constexpr int TR = Vec::TR;

// The score products' vectors: sixteen floats in an AVX-512 register where the build has AVX-512 (twice the work per
// instruction; on CPUs with 512-bit FMA units, twice the rate), else Vec. Rows per product tile: 8 where there are 32
// registers (2 x 8 accumulators, 2 vectors of keys, a broadcast), else 4.
#if defined(__AVX512F__)
struct Vec16 {
  static constexpr int W = 16;
  __m512 v;
  static Vec16 zero() { return {_mm512_setzero_ps()}; }
  static Vec16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Vec16 bcast(const float* p) { return {_mm512_set1_ps(*p)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  friend Vec16 fma(Vec16 a, Vec16 b, Vec16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  friend Vec16 operator+(Vec16 a, Vec16 b) { return {_mm512_add_ps(a.v, b.v)}; }
  friend Vec16 operator-(Vec16 a, Vec16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
  friend Vec16 operator*(Vec16 a, Vec16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  float sum() const { return _mm512_reduce_add_ps(v); }
};
using Wide = Vec16;
constexpr int GR = 8;
#else
using Wide = Vec;
constexpr int GR = 4;
#endif
constexpr int64_t KEYS = 2 * Wide::W;  // keys per score tile
constexpr int64_t ROWS = 16;  // queries per block (their scores stay in L2)
constexpr int64_t PV_KEYS = 64;  // keys per step of the probabilities-times-values product (their values stay in L1)

// The (sequence, head) tasks per chunk of at::parallel_for: enough that a chunk does at least ATen's grain of work
// (about `work` multiply-adds a task), so that a small call runs on the calling thread instead of waking the pool's
// threads, which costs more than it saves and, on a virtual machine, now and then milliseconds.
inline int64_t tasks_per_chunk(int64_t work) {
  constexpr int64_t grain = 32768;  // at::internal::GRAIN_SIZE, what ATen's element-wise operators take
  return std::max<int64_t>(1, grain / std::max<int64_t>(1, work));
}

// exp(x) for the scores minus their row's maximum (x <= 0): Cephes' expf polynomial, within 2 ulp; 0 below -87.3.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);  // (this order keeps a NaN: maxps returns its second operand)
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // x - n ln 2, in two parts
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));  // y 2^n
}

#if defined(__AVX512F__)
inline __m256 upper_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// exp_nonpositive on sixteen floats (the same polynomial).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);  // (as above: a NaN stays)
  __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                  _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(exponent));
}
#endif

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

inline float horizontal_sum(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// y[0:n) = x[0:n) * factor.
inline void scale_row(const float* x, float factor, int64_t n, float* y) {
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 wide = _mm512_set1_ps(factor);
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), wide));
#endif
  const __m256 f = _mm256_set1_ps(factor);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), f));
  for (; j < n; ++j) y[j] = x[j] * factor;
}

inline float Vec::sum() const { return horizontal_sum(v); }

// The largest of s[0:n) (-FLT_MAX for n = 0).
inline float row_maximum(const float* s, int64_t n) {
  __m256 running = _mm256_set1_ps(-FLT_MAX);
  int64_t j = 0;
#if defined(__AVX512F__)
  __m512 wide = _mm512_set1_ps(-FLT_MAX);
  for (; j + 16 <= n; j += 16) wide = _mm512_max_ps(wide, _mm512_loadu_ps(s + j));
  running = _mm256_max_ps(_mm512_castps512_ps256(wide), upper_half(wide));
#endif
  for (; j + 8 <= n; j += 8) running = _mm256_max_ps(running, _mm256_loadu_ps(s + j));
  float maximum = horizontal_max(running);
  for (; j < n; ++j) maximum = std::max(maximum, s[j]);
  return maximum;
}

// The sum of exp(s[j] - maximum) over j < n (maximum >= every s[j]); where kWrite, each s[j] replaced by its exp (the
// softmax before its division), else s only read.
template <bool kWrite>
inline float exponentials(std::conditional_t<kWrite, float*, const float*> s, int64_t n, float maximum) {
  const __m256 max_vector = _mm256_set1_ps(maximum);
  __m256 sum_vector = _mm256_setzero_ps();
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 wide_max = _mm512_set1_ps(maximum);
  __m512 wide_sum = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + j), wide_max));
    if constexpr (kWrite) _mm512_storeu_ps(s + j, e);
    wide_sum = _mm512_add_ps(wide_sum, e);
  }
  sum_vector = _mm256_add_ps(_mm512_castps512_ps256(wide_sum), upper_half(wide_sum));
#endif
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), max_vector));
    if constexpr (kWrite) _mm256_storeu_ps(s + j, e);
    sum_vector = _mm256_add_ps(sum_vector, e);
  }
  float sum = horizontal_sum(sum_vector);
  for (; j < n; ++j) {
    const float e = std::exp(s[j] - maximum);
    if constexpr (kWrite) s[j] = e;
    sum += e;
  }
  return sum;
}

// s[j] = exp(s[j] - maximum) for j < n, in place (the softmax before its division); returns their sum.
inline float exponentiate(float* s, int64_t n, float maximum) { return exponentials<true>(s, n, maximum); }

// dst[c][r] = src[r][c] for an 8 x 8 block (rows src_stride / dst_stride floats apart).
inline void transpose_8x8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m256 row[8], pair[8];
  for (int r = 0; r < 8; ++r) row[r] = _mm256_loadu_ps(src + r * src_stride);
  for (int r = 0; r < 8; r += 2) {
    pair[r] = _mm256_unpacklo_ps(row[r], row[r + 1]);
    pair[r + 1] = _mm256_unpackhi_ps(row[r], row[r + 1]);
  }
  for (int r = 0; r < 8; r += 4) {
    row[r] = _mm256_shuffle_ps(pair[r], pair[r + 2], _MM_SHUFFLE(1, 0, 1, 0));
    row[r + 1] = _mm256_shuffle_ps(pair[r], pair[r + 2], _MM_SHUFFLE(3, 2, 3, 2));
    row[r + 2] = _mm256_shuffle_ps(pair[r + 1], pair[r + 3], _MM_SHUFFLE(1, 0, 1, 0));
    row[r + 3] = _mm256_shuffle_ps(pair[r + 1], pair[r + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int r = 0; r < 4; ++r) {
    _mm256_storeu_ps(dst + r * dst_stride, _mm256_permute2f128_ps(row[r], row[r + 4], 0x20));
    _mm256_storeu_ps(dst + (r + 4) * dst_stride, _mm256_permute2f128_ps(row[r], row[r + 4], 0x31));
  }
}

// out[r][0, KEYS) = sum_d a[r][d] bt[d][col + (0, KEYS)] for R rows of a (D apart), plus addend[r][0, KEYS) where
// addend is given: bt is transposed keys or relative keys [D, ld], whose KEYS consecutive columns per width index
// are two vectors, shared by the R rows (a broadcast each). The scores are two such products: the position product
// of a group of rows into a buffer first, then the content product with the shifted position scores added to it.
template <int R>
inline void product_tile(const float* a, int64_t D, const float* bt, int64_t ld, int64_t col, float* const* out,
                         const float* const* addend) {
  using V = Wide;
  V acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V::zero();
  for (int64_t d = 0; d < D; ++d) {
    const float* b = bt + d * ld + col;
    const V b0 = V::load(b), b1 = V::load(b + V::W);
    for (int r = 0; r < R; ++r) {
      const V x = V::bcast(a + r * D + d);
      acc[r][0] = fma(x, b0, acc[r][0]);
      acc[r][1] = fma(x, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (addend != nullptr) {
      acc[r][0] = acc[r][0] + V::load(addend[r]);
      acc[r][1] = acc[r][1] + V::load(addend[r] + V::W);
    }
    acc[r][0].store(out[r]);
    acc[r][1].store(out[r] + V::W);
  }
}

// o[r][0:C W] += sum_j p[r][j] v[j][0:C W] for R rows (p rows ld apart, o rows D apart), V's W floats a vector.
template <class V, int R, int C>
inline void values_tile(const float* p, int64_t ld, const float* v, int64_t v_stride, int64_t n, float* o,
                        int64_t D) {
  V a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = V::load(o + r * D + V::W * c);
  for (int64_t j = 0; j < n; ++j) {
    V vj[C];
    for (int c = 0; c < C; ++c) vj[c] = V::load(v + j * v_stride + V::W * c);
    for (int r = 0; r < R; ++r) {
      const V b = V::bcast(p + r * ld + j);
      for (int c = 0; c < C; ++c) a[r][c] = fma(b, vj[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c].store(o + r * D + V::W * c);
}

// out[r][0:D] += sum_j p[r][j] v[j][0:D] for the block's `rows` (a multiple of GR): 16-float vectors where D allows,
// else 8.
inline void values_block(const float* p, int64_t ld, const float* v, int64_t v_stride, int64_t n, float* out,
                         int64_t D, int64_t rows) {
  if (Wide::W == 16 && D % 16 == 0) {
    for (int64_t r = 0; r < rows; r += GR)
      for (int64_t c = 0; c < D; c += 2 * Wide::W) {
        if (D - c >= 2 * Wide::W)
          values_tile<Wide, GR, 2>(p + r * ld, ld, v + c, v_stride, n, out + r * D + c, D);
        else
          values_tile<Wide, GR, 1>(p + r * ld, ld, v + c, v_stride, n, out + r * D + c, D);
      }
    return;
  }
  for (int64_t r = 0; r < rows; r += TR)
    for (int64_t c = 0; c < D; c += 4 * Vec::W) {
      const float* pr = p + r * ld;
      float* o = out + r * D + c;
      switch (std::min<int64_t>(4, (D - c) / Vec::W)) {
        case 4: values_tile<Vec, TR, 4>(pr, ld, v + c, v_stride, n, o, D); break;
        case 3: values_tile<Vec, TR, 3>(pr, ld, v + c, v_stride, n, o, D); break;
        case 2: values_tile<Vec, TR, 2>(pr, ld, v + c, v_stride, n, o, D); break;
        default: values_tile<Vec, TR, 1>(pr, ld, v + c, v_stride, n, o, D); break;
      }
    }
}

}  // namespace

namespace {

// query [B, H, Q, D]; key, value [B, H, K, D]; rel_key [H, K, D] (row r: distance K-1-r); content_bias,
// position_bias (u, v) [H, D]; mask [B or 1, Q, K] bool, True = hidden, hiding at least every key j > M + i.
// Any strides with the last dimension contiguous. Returns [B, Q, H, D] (the layout the output projection reads);
// with `probs` ([H B, Q, K], head-major, contiguous: what the training backward reads) also the probabilities.
at::Tensor attention_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const at::Tensor& rel_key, const at::Tensor& content_bias,
                             const at::Tensor& position_bias, const at::Tensor& mask, double scaling,
                             float* probs_data) {
  for (const at::Tensor* t : {&query, &key, &value, &rel_key, &content_bias, &position_bias})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->stride(-1) == 1,
                "relative attention kernel: float32 CPU tensors with a contiguous last dimension expected");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.sizes() == key.sizes() && rel_key.dim() == 3 &&
                  mask.dim() == 3 && mask.scalar_type() == at::kBool,
              "relative attention kernel: query [B, H, Q, D], key / value [B, H, K, D], rel_key [H, K, D], "
              "mask [B or 1, Q, K] (bool) expected");
  const int64_t B = query.size(0), H = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t K = key.size(2), M = K - Q;
  TORCH_CHECK(key.size(0) == B && key.size(1) == H && key.size(3) == D && M >= 0 && D % Vec::W == 0 &&
                  rel_key.size(0) == H && rel_key.size(1) == K && rel_key.size(2) == D &&
                  content_bias.numel() == H * D && position_bias.numel() == H * D && content_bias.is_contiguous() &&
                  position_bias.is_contiguous() && (mask.size(0) == 1 || mask.size(0) == B) && mask.size(1) == Q &&
                  mask.size(2) == K,
              "relative attention kernel: mismatched shapes");
  auto output = at::empty({B, Q, H, D}, query.options());
  const float* query_data = query.data_ptr<float>();
  const float* key_data = key.data_ptr<float>();
  const float* value_data = value.data_ptr<float>();
  const float* rel_data = rel_key.data_ptr<float>();
  const float* u = content_bias.data_ptr<float>();
  const float* v = position_bias.data_ptr<float>();
  const bool* mask_data = mask.data_ptr<bool>();
  float* output_data = output.data_ptr<float>();
  // Columns of the transposed keys and of the score and position buffers: room for the last tiles' reads and writes
  // (a tile of KEYS past a row's visible keys, and a shift of up to GR - 1 within a group of rows).
  const int64_t ld = (K + 3 * KEYS + 15) / 16 * 16;
  const int64_t value_stride = value.stride(2), mask_stride = mask.stride(2);
  const float scale = static_cast<float>(scaling), lowest = -FLT_MAX;

  at::parallel_for(0, B * H, tasks_per_chunk(Q * K * D), [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * ld), rt(D * ld), scores(ROWS * ld), position(ROWS * ld), cq(ROWS * D), pq(ROWS * D);
    std::vector<float> out(ROWS * D);
    std::vector<float> row_sum(ROWS);
    std::vector<char> all_hidden(ROWS);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q_bh = query_data + b * query.stride(0) + h * query.stride(1);
      const float* k_bh = key_data + b * key.stride(0) + h * key.stride(1);
      const float* v_bh = value_data + b * value.stride(0) + h * value.stride(1);
      const float* r_h = rel_data + h * rel_key.stride(0);
      const bool* mask_b = mask_data + (mask.size(0) == 1 ? 0 : b * mask.stride(0));
      // Transpose the keys and relative keys to [D, ld]: a tile reads KEYS consecutive keys per width index.
      for (int64_t d = 0; d < D; ++d) {
        std::fill(&kt[d * ld] + K, &kt[d * ld] + ld, 0.0f);
        std::fill(&rt[d * ld] + K, &rt[d * ld] + ld, 0.0f);
      }
      int64_t first = 0;
      for (; first + 8 <= K; first += 8)
        for (int64_t d = 0; d < D; d += 8) {
          transpose_8x8(k_bh + first * key.stride(2) + d, key.stride(2), &kt[d * ld + first], ld);
          transpose_8x8(r_h + first * rel_key.stride(1) + d, rel_key.stride(1), &rt[d * ld + first], ld);
        }
      for (int64_t j = first; j < K; ++j)
        for (int64_t d = 0; d < D; ++d) {
          kt[d * ld + j] = k_bh[j * key.stride(2) + d];
          rt[d * ld + j] = r_h[j * rel_key.stride(1) + d];
        }
      for (int64_t start = 0; start < Q; start += ROWS) {
        const int64_t rows = std::min(ROWS, Q - start), block_rows = (rows + GR - 1) / GR * GR;  // whole tiles
        auto query_of = [&](int64_t r) { return start + std::min(r, rows - 1); };  // padding rows repeat the last
        auto visible_of = [&](int64_t r) { return std::min(K, M + query_of(r) + 1); };
        const int64_t block_visible = visible_of(block_rows - 1);  // the keys the block's last query sees
        for (int64_t r = 0; r < block_rows; ++r) {
          const float* q_i = q_bh + query_of(r) * query.stride(2);
          for (int64_t d = 0; d < D; ++d) {
            cq[r * D + d] = (q_i[d] + u[h * D + d]) * scale;
            pq[r * D + d] = (q_i[d] + v[h * D + d]) * scale;
          }
        }
        // Scores, a group of GR rows at a time. Query i's position score for key j is pq_i . rt[:, j + off_i], with
        // off_i = Q - 1 - i: within a group the offsets are `base` (its last row's) + 0..GR-1, so one product of the
        // group's rows with the columns from `base` (as many as its last row sees keys: every row's visible columns
        // end at K) holds them all, shifted per row. Then the content product, adding each row's shifted slice.
        for (int64_t r = 0; r < block_rows; r += GR) {
          const int64_t base = Q - 1 - query_of(r + GR - 1), visible = visible_of(r + GR - 1);
          float* position_rows[GR];
          float* score_rows[GR];
          const float* shifted[GR];
          for (int t = 0; t < GR; ++t) position_rows[t] = &position[(r + t) * ld];
          for (int64_t c = 0; c < visible; c += KEYS) {
            product_tile<GR>(&pq[r * D], D, rt.data(), ld, base + c, position_rows, nullptr);
            for (int t = 0; t < GR; ++t) position_rows[t] += KEYS;
          }
          for (int64_t j = 0; j < visible; j += KEYS) {
            for (int t = 0; t < GR; ++t) {
              score_rows[t] = &scores[(r + t) * ld + j];
              shifted[t] = &position[(r + t) * ld + j + (Q - 1 - query_of(r + t)) - base];
            }
            product_tile<GR>(&cq[r * D], D, kt.data(), ld, j, score_rows, shifted);
          }
        }
        // The mask and the softmax (not normalised: the output is divided by the row's sum at the end).
        for (int64_t r = 0; r < block_rows; ++r) {
          const int64_t visible = visible_of(r);
          float* s = &scores[r * ld];
          const bool* hidden = mask_b + query_of(r) * mask.stride(1);
          const bool masked_row = mask_stride != 1 || std::memchr(hidden, 1, visible) != nullptr;
          if (masked_row)
            for (int64_t j = 0; j < visible; ++j)
              if (hidden[j * mask_stride]) s[j] = lowest;
          const float maximum = row_maximum(s, visible);
          all_hidden[r] = maximum == lowest;
          if (all_hidden[r]) {  // every key hidden: uniform over all K keys, as the readable path's softmax
            std::fill(s, s + K, 1.0f);
            row_sum[r] = static_cast<float>(K);
            continue;
          }
          row_sum[r] = exponentiate(s, visible, maximum);
          if (masked_row)  // exactly 0, as the readable softmax gives (the exp's clamp leaves about 1e-38)
            for (int64_t j = 0; j < visible; ++j)
              if (hidden[j * mask_stride]) s[j] = 0.0f;
          std::fill(s + visible, s + block_visible, 0.0f);  // the values' product reads to the block's end
        }
        int64_t value_keys = block_visible;
        if (std::find(all_hidden.begin(), all_hidden.begin() + block_rows, 1) != all_hidden.begin() + block_rows) {
          value_keys = K;  // a fully hidden row averages all the values
          for (int64_t r = 0; r < block_rows; ++r)
            if (!all_hidden[r]) std::fill(&scores[r * ld] + block_visible, &scores[r * ld] + K, 0.0f);
        }
        // The probabilities times the values, PV_KEYS keys at a time for all the block's rows.
        std::fill(out.begin(), out.end(), 0.0f);
        for (int64_t j = 0; j < value_keys; j += PV_KEYS) {
          const int64_t n = std::min(PV_KEYS, value_keys - j);
          values_block(&scores[j], ld, v_bh + j * value_stride, value_stride, n, out.data(), D, block_rows);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float inverse = 1.0f / row_sum[r];
          float* o = output_data + ((b * Q + start + r) * H + h) * D;
          for (int64_t d = 0; d < D; ++d) o[d] = out[r * D + d] * inverse;
          if (probs_data != nullptr) {  // the whole row: hidden keys' probabilities are 0
            float* p = probs_data + ((h * B + b) * Q + start + r) * K;
            const float* e = &scores[r * ld];
            const int64_t n = all_hidden[r] ? K : visible_of(r);
            scale_row(e, inverse, n, p);
            std::fill(p + n, p + K, 0.0f);
          }
        }
      }
    }
  });
  return output;
}

}  // namespace

at::Tensor relative_attention_inference(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& rel_key, const at::Tensor& content_bias,
                                        const at::Tensor& position_bias, const at::Tensor& mask, double scaling) {
  return attention_forward(query, key, value, rel_key, content_bias, position_bias, mask, scaling, nullptr);
}

// The inference kernel's forward, also writing the probabilities [H B, Q, K] for the training backward
// (kernels_txl._CompiledRelativeAttentionFunction). Returns (output [B, Q, H, D], probs).
std::tuple<at::Tensor, at::Tensor> relative_attention_training_forward(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& rel_key,
    const at::Tensor& content_bias, const at::Tensor& position_bias, const at::Tensor& mask, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4, "relative_attention_training_forward: query, key [B, H, ., D]");
  auto probs = at::empty({query.size(1) * query.size(0), query.size(2), key.size(2)}, query.options());
  auto output = attention_forward(query, key, value, rel_key, content_bias, position_bias, mask, scaling,
                                  probs.data_ptr<float>());
  return {output, probs};
}

namespace {

// The gradient of R rows' scores for KEYS keys from j: ds[r] = p[r] * (g[r] . vt[:, j + (0, KEYS)] - row_dot[r]),
// the softmax's backward of dL/dp = g v^T (g: the output's gradient, rows of D; vt: the values transposed [D, ld]).
template <int R>
inline void score_grad_tile(const float* const* g, int64_t D, const float* vt, int64_t ld, int64_t j,
                            const float* const* p, const float* row_dot, float* const* ds) {
  using V = Wide;
  V acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V::zero();
  for (int64_t d = 0; d < D; ++d) {
    const float* b = vt + d * ld + j;
    const V b0 = V::load(b), b1 = V::load(b + V::W);
    for (int r = 0; r < R; ++r) {
      const V x = V::bcast(g[r] + d);
      acc[r][0] = fma(x, b0, acc[r][0]);
      acc[r][1] = fma(x, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const V dot = V::bcast(row_dot + r);
    ((acc[r][0] - dot) * V::load(p[r])).store(ds[r]);
    ((acc[r][1] - dot) * V::load(p[r] + V::W)).store(ds[r] + V::W);
  }
}

// Asks for the cache lines of `count` floats from `row` (an address past the tensor's end is harmless: a prefetch
// never faults). Streams of rows read once (decoding's weights, keys and values) run faster with their next rows
// asked for ahead of use than with the hardware prefetcher alone (docs/performance-log.md).
inline void prefetch_row(const float* row, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t line = 0; line < count * 4; line += 64) _mm_prefetch(bytes + line, _MM_HINT_T0);
}
constexpr int64_t kRowsAhead = 16;  // decoding's keys and values: rows asked for ahead of use

#if defined(__AVX512F__)
// The sums of sixteen registers' lanes, [sum(acc[0]), ..., sum(acc[15])], by a tree of shuffles instead of sixteen
// horizontal sums.
inline __m512 sixteen_sums(const __m512* acc) {
  // Pairs of registers, then fours: in each 128-bit lane, the partial sums of registers 4k..4k+3 over that lane.
  __m512 pairs[8], fours[4];
  for (int k = 0; k < 8; ++k)
    pairs[k] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * k], acc[2 * k + 1]),
                             _mm512_unpackhi_ps(acc[2 * k], acc[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(pairs[2 * k]), c = _mm512_castps_pd(pairs[2 * k + 1]);
    fours[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, c)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, c)));
  }
  // Then across the four lanes: lanes (0 + 1, 2 + 3) of two fours side by side, twice.
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(fours[0], fours[1], 0x88),
                                   _mm512_shuffle_f32x4(fours[0], fours[1], 0xDD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(fours[2], fours[3], 0x88),
                                    _mm512_shuffle_f32x4(fours[2], fours[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

// Short rows (the adaptive softmax's tail clusters: 16 or 64 inputs): four rows per step spend more on their four
// horizontal sums than on reading them. Sixteen rows at a time instead, one accumulator each, whose sums a
// transposition tree gathers into one vector of the sixteen outputs. Rows [begin, end) of y = w x + b, sixteen at a
// time, each row's chunks in turn: the loads run through memory in order, which the hardware prefetcher follows
// (chunk by chunk across the sixteen rows, a stride of the row's length, it lagged, software prefetch or not:
// docs/performance-log.md); returns the first row it did not compute (the caller does the rest).
constexpr int64_t kShortRow = 128;

inline int64_t short_rows_linear(const float* w, const float* x, const float* b, float* y, int64_t I, int64_t begin,
                                 int64_t end) {
  const int64_t chunks = (I + 15) / 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (I - 16 * (chunks - 1))) - 1u);
  __m512 xs[kShortRow / 16];
  for (int64_t c = 0; c < chunks; ++c) xs[c] = _mm512_maskz_loadu_ps(c + 1 < chunks ? 0xFFFF : tail, x + 16 * c);
  int64_t o = begin;
  for (; o + 16 <= end; o += 16) {
    const float* rows = w + o * I;
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) {
      acc[r] = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c)
        acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(c + 1 < chunks ? 0xFFFF : tail, rows + r * I + 16 * c), xs[c],
                                 acc[r]);
    }
    __m512 sums = sixteen_sums(acc);
    if (b != nullptr) sums = _mm512_add_ps(sums, _mm512_loadu_ps(b + o));
    _mm512_storeu_ps(y + o, sums);
  }
  return o;
}
#endif

inline float dot_product(const float* a, const float* b, int64_t n) {
  __m256 sum = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) sum = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), sum);
  float total = horizontal_sum(sum);
  for (; d < n; ++d) total += a[d] * b[d];
  return total;
}

}  // namespace

// The training backward's score gradient, in the layout its position products read (kernels_txl.
// _relative_attention_backward): grad_output, output [B, Q, H, D] (the forward's output and its gradient); value
// [B, H, K, D] (any strides, the last dimension contiguous); probs [H B, Q, K] (the forward's). Returns [H, B,
// (K + 1) Q]: per (head, sequence) Q zeros, then dS [Q, K] with dS[i][j] = p[i][j] (dO_i . v_j - dO_i . o_i), the
// softmax's backward (sum_j p dL/dp = dO . o, as o = p v). One pass instead of a product into a strided view (one
// small matrix product per (head, sequence)) and two element-wise passes.
at::Tensor relative_attention_score_grad(const at::Tensor& grad_output, const at::Tensor& output,
                                         const at::Tensor& value, const at::Tensor& probs) {
  for (const at::Tensor* t : {&grad_output, &output, &value, &probs})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->stride(-1) == 1,
                "relative_attention_score_grad: float32 CPU tensors with a contiguous last dimension expected");
  TORCH_CHECK(grad_output.dim() == 4 && output.sizes() == grad_output.sizes() && value.dim() == 4 &&
                  probs.dim() == 3 && probs.is_contiguous(),
              "relative_attention_score_grad: grad_output, output [B, Q, H, D], value [B, H, K, D], probs [H B, Q, K] "
              "(contiguous) expected");
  const int64_t B = grad_output.size(0), Q = grad_output.size(1), H = grad_output.size(2), D = grad_output.size(3);
  const int64_t K = value.size(2);
  TORCH_CHECK(value.size(0) == B && value.size(1) == H && value.size(3) == D && D % 8 == 0 &&
                  probs.size(0) == H * B && probs.size(1) == Q && probs.size(2) == K,
              "relative_attention_score_grad: mismatched shapes");
  auto grad = at::empty({H, B, (K + 1) * Q}, probs.options());
  const float* go_data = grad_output.data_ptr<float>();
  const float* out_data = output.data_ptr<float>();
  const float* value_data = value.data_ptr<float>();
  const float* probs_data = probs.data_ptr<float>();
  float* grad_data = grad.data_ptr<float>();
  const int64_t ld = (K + KEYS + 15) / 16 * 16;
  const int64_t gs0 = grad_output.stride(0), gs1 = grad_output.stride(1), gs2 = grad_output.stride(2);
  const int64_t os0 = output.stride(0), os1 = output.stride(1), os2 = output.stride(2);
  const int64_t vs2 = value.stride(2);

  at::parallel_for(0, H * B, tasks_per_chunk(Q * K * D), [&](int64_t begin, int64_t end) {
    std::vector<float> vt(D * ld), tail_p(GR * KEYS), tail_ds(GR * KEYS), spare(GR * KEYS);
    for (int64_t hb = begin; hb < end; ++hb) {
      const int64_t h = hb / B, b = hb % B;  // probs and the result are head-major
      const float* v_bh = value_data + b * value.stride(0) + h * value.stride(1);
      for (int64_t d = 0; d < D; ++d) std::fill(&vt[d * ld] + K, &vt[d * ld] + ld, 0.0f);
      int64_t first = 0;
      for (; first + 8 <= K; first += 8)
        for (int64_t d = 0; d < D; d += 8) transpose_8x8(v_bh + first * vs2 + d, vs2, &vt[d * ld + first], ld);
      for (int64_t j = first; j < K; ++j)
        for (int64_t d = 0; d < D; ++d) vt[d * ld + j] = v_bh[j * vs2 + d];
      float* grad_hb = grad_data + hb * (K + 1) * Q;
      std::fill(grad_hb, grad_hb + Q, 0.0f);
      float* ds_hb = grad_hb + Q;  // row i at i K
      const float* p_hb = probs_data + hb * Q * K;
      for (int64_t i0 = 0; i0 < Q; i0 += GR) {
        const int64_t rows = std::min<int64_t>(GR, Q - i0);
        const float* g[GR];
        float row_dot[GR];
        for (int t = 0; t < GR; ++t) {
          const int64_t i = i0 + std::min<int64_t>(t, rows - 1);  // padding rows repeat the last (not stored)
          g[t] = go_data + b * gs0 + i * gs1 + h * gs2;
          row_dot[t] = dot_product(g[t], out_data + b * os0 + i * os1 + h * os2, D);
        }
        const float* p[GR];
        float* ds[GR];
        for (int64_t j = 0; j < K; j += KEYS) {
          const int64_t n = std::min(KEYS, K - j);
          for (int t = 0; t < GR; ++t) {
            const int64_t i = i0 + std::min<int64_t>(t, rows - 1);
            if (n == KEYS) {
              p[t] = p_hb + i * K + j;
              ds[t] = t < rows ? ds_hb + i * K + j : &spare[t * KEYS];
            } else {  // the last keys: through buffers of a whole tile (the rows are contiguous)
              std::copy(p_hb + i * K + j, p_hb + i * K + K, &tail_p[t * KEYS]);
              std::fill(&tail_p[t * KEYS] + n, &tail_p[t * KEYS] + KEYS, 0.0f);
              p[t] = &tail_p[t * KEYS];
              ds[t] = &tail_ds[t * KEYS];
            }
          }
          score_grad_tile<GR>(g, D, vt.data(), ld, j, p, row_dot, ds);
          if (n < KEYS)
            for (int64_t t = 0; t < rows; ++t)
              std::copy(&tail_ds[t * KEYS], &tail_ds[t * KEYS] + n, ds_hb + (i0 + t) * K + j);
        }
      }
    }
  });
  return grad;
}

namespace {

// The sums of eight vectors' lanes: [sum(a[0]), ..., sum(a[7])].
inline __m256 eight_sums(const __m256* a) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

}  // namespace

// The query with the content and position biases, scaled: cq = (q + u) scale, pq = (q + v) scale (D floats each).
inline void biased_queries(const float* q, const float* u_h, const float* v_h, int64_t D, float scale, float* cq,
                           float* pq) {
  for (int64_t d = 0; d < D; ++d) {
    cq[d] = (q[d] + u_h[d]) * scale;
    pq[d] = (q[d] + v_h[d]) * scale;
  }
}

#if defined(__AVX512F__)
// one_query_head (below) for D a multiple of 16, in AVX-512 registers: sixteen keys per step of the scores (one
// accumulator each, their sums gathered by `sixteen_sums`; each key's row and relative key's row read whole in turn,
// in memory order, as short_rows_linear reads), and the values' rows into two sums, of the even and the odd keys, so
// that each addition into a register waits on half as many before it (four registers hold D = 64).
inline void one_query_head16(const float* q, const float* k_bh, int64_t key_stride, const float* v_bh,
                             int64_t value_stride, const float* r_h, int64_t rel_stride, const float* u_h,
                             const float* v_h, const bool* hidden, int64_t hidden_stride, int64_t K, int64_t D,
                             float scale, float* scratch, float* o) {
  float *cq = scratch, *pq = scratch + D, *scores = scratch + 2 * D;
  biased_queries(q, u_h, v_h, D, scale, cq, pq);
  int64_t j = 0;
  for (; j + 16 <= K; j += 16) {
    for (int t = 0; t < 16; ++t) {
      prefetch_row(k_bh + (j + kRowsAhead + t) * key_stride, D);
      prefetch_row(r_h + (j + kRowsAhead + t) * rel_stride, D);
    }
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) {
      acc[t] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 16) {
        acc[t] = _mm512_fmadd_ps(_mm512_loadu_ps(cq + d), _mm512_loadu_ps(k_bh + (j + t) * key_stride + d), acc[t]);
        acc[t] = _mm512_fmadd_ps(_mm512_loadu_ps(pq + d), _mm512_loadu_ps(r_h + (j + t) * rel_stride + d), acc[t]);
      }
    }
    _mm512_storeu_ps(&scores[j], sixteen_sums(acc));
  }
  for (; j < K; ++j) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(cq + d), _mm512_loadu_ps(k_bh + j * key_stride + d), acc);
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(pq + d), _mm512_loadu_ps(r_h + j * rel_stride + d), acc);
    }
    scores[j] = _mm512_reduce_add_ps(acc);
  }
  if (hidden != nullptr)
    for (j = 0; j < K; ++j)
      if (hidden[j * hidden_stride]) scores[j] = -FLT_MAX;
  const float sum = exponentiate(scores, K, row_maximum(scores, K));
  const __m512 inverse = _mm512_set1_ps(1.0f / sum);
  for (int64_t c = 0; c < D; c += 64) {  // up to four registers of the output at a time: one pass for D <= 64
    const int chunks = static_cast<int>(std::min<int64_t>(4, (D - c) / 16));
    __m512 even[4], odd[4];
    for (int t = 0; t < 4; ++t) even[t] = odd[t] = _mm512_setzero_ps();
    for (j = 0; j + 2 <= K; j += 2) {
      if (c == 0) {
        prefetch_row(v_bh + (j + kRowsAhead) * value_stride, D);
        prefetch_row(v_bh + (j + 1 + kRowsAhead) * value_stride, D);
      }
      const __m512 p0 = _mm512_set1_ps(scores[j]), p1 = _mm512_set1_ps(scores[j + 1]);
      const float* row = v_bh + j * value_stride + c;
      for (int t = 0; t < chunks; ++t) {
        even[t] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(row + 16 * t), even[t]);
        odd[t] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(row + value_stride + 16 * t), odd[t]);
      }
    }
    if (j < K) {  // (an odd count of keys: the last one)
      const __m512 p0 = _mm512_set1_ps(scores[j]);
      const float* row = v_bh + j * value_stride + c;
      for (int t = 0; t < chunks; ++t) even[t] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(row + 16 * t), even[t]);
    }
    for (int t = 0; t < chunks; ++t)
      _mm512_storeu_ps(o + c + 16 * t, _mm512_mul_ps(_mm512_add_ps(even[t], odd[t]), inverse));
  }
}
#endif

// One head of one query: o = softmax(s) v with s_j = ((q + u) . k_j + (q + v) . r_j) * scale over K keys (rows of
// k, r, v at their strides), s_j = -inf where hidden[j * hidden_stride] (hidden may be null). scratch: 2 D + K + 8
// floats. Each row of the keys, relative keys and values is read once, in place, 8 keys per step (AVX-512 builds:
// one_query_head16 where D is a multiple of 16).
inline void one_query_head(const float* q, const float* k_bh, int64_t key_stride, const float* v_bh,
                           int64_t value_stride, const float* r_h, int64_t rel_stride, const float* u_h,
                           const float* v_h, const bool* hidden, int64_t hidden_stride, int64_t K, int64_t D,
                           float scale, float* scratch, float* o) {
#if defined(__AVX512F__)
  if (D % 16 == 0)
    return one_query_head16(q, k_bh, key_stride, v_bh, value_stride, r_h, rel_stride, u_h, v_h, hidden, hidden_stride,
                            K, D, scale, scratch, o);
#endif
  float *cq = scratch, *pq = scratch + D, *scores = scratch + 2 * D;
  biased_queries(q, u_h, v_h, D, scale, cq, pq);
  // s_j = cq . k_j + pq . r_j, eight keys at a time (one accumulator each, summed across lanes at the end; each
  // key's rows read whole in turn, in memory order)
  int64_t j = 0;
  for (; j + 8 <= K; j += 8) {
    for (int t = 0; t < 8; ++t) {
      prefetch_row(k_bh + (j + kRowsAhead + t) * key_stride, D);
      prefetch_row(r_h + (j + kRowsAhead + t) * rel_stride, D);
    }
    __m256 acc[8];
    for (int t = 0; t < 8; ++t) {
      acc[t] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(cq + d), _mm256_loadu_ps(k_bh + (j + t) * key_stride + d), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(pq + d), _mm256_loadu_ps(r_h + (j + t) * rel_stride + d), acc[t]);
      }
    }
    _mm256_storeu_ps(&scores[j], eight_sums(acc));
  }
  for (; j < K; ++j) {
    float sum = 0.0f;
    for (int64_t d = 0; d < D; ++d) sum += cq[d] * k_bh[j * key_stride + d] + pq[d] * r_h[j * rel_stride + d];
    scores[j] = sum;
  }
  if (hidden != nullptr)
    for (j = 0; j < K; ++j)
      if (hidden[j * hidden_stride]) scores[j] = -FLT_MAX;
  // (every key hidden: all scores equal, a uniform average, as eager's)
  const float sum = exponentiate(scores, K, row_maximum(scores, K));
  const __m256 inverse = _mm256_set1_ps(1.0f / sum);
  for (int64_t c = 0; c < D; c += 64) {  // up to eight registers of the output at a time: one pass for D <= 64
    const int chunks = static_cast<int>(std::min<int64_t>(8, (D - c) / 8));
    __m256 acc[8];
    for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
    for (j = 0; j < K; ++j) {
      if (c == 0) prefetch_row(v_bh + (j + kRowsAhead) * value_stride, D);
      const __m256 p = _mm256_broadcast_ss(&scores[j]);
      const float* row = v_bh + j * value_stride + c;
      for (int t = 0; t < chunks; ++t) acc[t] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row + 8 * t), acc[t]);
    }
    for (int t = 0; t < chunks; ++t) _mm256_storeu_ps(o + c + 8 * t, _mm256_mul_ps(acc[t], inverse));
  }
}

// One query per sequence (decoding): query [B, H, 1, D]; key, value [B, H, K, D]; rel_key [H, K, D]; the biases
// [H, D]; mask [B or 1, K] bool (True = hidden) or none. A single query needs no shift (its relative key j is row j)
// and no transposition: `one_query_head` for each (sequence, head). Returns [B, H, 1, D].
at::Tensor relative_attention_one_query(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& rel_key, const at::Tensor& content_bias,
                                        const at::Tensor& position_bias, const std::optional<at::Tensor>& mask,
                                        double scaling) {
  for (const at::Tensor* t : {&query, &key, &value, &rel_key, &content_bias, &position_bias})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->stride(-1) == 1,
                "relative_attention_one_query: float32 CPU tensors with a contiguous last dimension expected");
  TORCH_CHECK(query.dim() == 4 && query.size(2) == 1 && key.dim() == 4 && value.sizes() == key.sizes() &&
                  rel_key.dim() == 3,
              "relative_attention_one_query: query [B, H, 1, D], key / value [B, H, K, D], rel_key [H, K, D]");
  const int64_t B = query.size(0), H = query.size(1), D = query.size(3), K = key.size(2);
  TORCH_CHECK(key.size(0) == B && key.size(1) == H && key.size(3) == D && D % Vec::W == 0 && rel_key.size(0) == H &&
                  rel_key.size(1) == K && rel_key.size(2) == D && content_bias.numel() == H * D &&
                  position_bias.numel() == H * D && content_bias.is_contiguous() && position_bias.is_contiguous(),
              "relative_attention_one_query: mismatched shapes");
  const bool masked = mask.has_value() && mask->defined();
  if (masked)
    TORCH_CHECK(mask->dim() == 2 && mask->scalar_type() == at::kBool && (mask->size(0) == 1 || mask->size(0) == B) &&
                    mask->size(1) == K,
                "relative_attention_one_query: mask [B or 1, K] (bool) expected");
  auto output = at::empty({B, H, 1, D}, query.options());
  const float* query_data = query.data_ptr<float>();
  const float* key_data = key.data_ptr<float>();
  const float* value_data = value.data_ptr<float>();
  const float* rel_data = rel_key.data_ptr<float>();
  const float* u = content_bias.data_ptr<float>();
  const float* v = position_bias.data_ptr<float>();
  float* output_data = output.data_ptr<float>();
  const int64_t key_stride = key.stride(2), rel_stride = rel_key.stride(1), value_stride = value.stride(2);
  const float scale = static_cast<float>(scaling);

  at::parallel_for(0, B * H, tasks_per_chunk(K * D), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(2 * D + K + Vec::W);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const bool* hidden =
          masked ? mask->data_ptr<bool>() + (mask->size(0) == 1 ? 0 : b * mask->stride(0)) : nullptr;
      one_query_head(query_data + b * query.stride(0) + h * query.stride(1),
                     key_data + b * key.stride(0) + h * key.stride(1), key_stride,
                     value_data + b * value.stride(0) + h * value.stride(1), value_stride,
                     rel_data + h * rel_key.stride(0), rel_stride, u + h * D, v + h * D, hidden,
                     masked ? mask->stride(1) : 0, K, D, scale, scratch.data(), output_data + (b * H + h) * D);
    }
  });
  return output;
}

#if defined(__AVX512F__)
// row_streams for rows that all start `lead` floats (1 to 15) before the end of a cache line (rows of a multiple of
// 16 floats in a weight off its lines, as a checkpoint's tensors sit where the file put them): a masked first vector
// up to the line, whole lines after, a masked last vector, so that no load of the weight spans two lines (which read
// slower at the memory's full rate: docs/performance-log.md).
template <int R>
inline void row_streams_off_line(const float* w, const float* x, const float* b, float* y, int64_t I, int64_t first,
                                 int64_t per, int64_t lead) {
  const int64_t stream = per * I;
  const auto head = static_cast<__mmask16>((1u << lead) - 1), tail = static_cast<__mmask16>((1u << (16 - lead)) - 1);
  for (int64_t j = 0; j < per; ++j) {
    const float* rows = w + (first + j) * I;
    __m512 acc[R];
    const __m512 x_head = _mm512_maskz_loadu_ps(head, x);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_mul_ps(_mm512_maskz_loadu_ps(head, rows + r * stream), x_head);
    int64_t i = lead;
    for (; i + 16 <= I; i += 16) {
      const __m512 xi = _mm512_loadu_ps(x + i);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(rows + r * stream + i), xi, acc[r]);
    }
    const __m512 x_tail = _mm512_maskz_loadu_ps(tail, x + i);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, rows + r * stream + i), x_tail, acc[r]);
    for (int r = 0; r < R; ++r) {
      const float sum = _mm512_reduce_add_ps(acc[r]);
      const int64_t row = first + r * per + j;
      y[row] = b == nullptr ? sum : sum + b[row];
    }
  }
}
#endif

// Rows first + r per + j (r < R, j < per) of y = w x + b (b may be null) for a row-major weight w [out, I]: R
// streams, stream r reading its `per` consecutive rows one after another (R independent sums, the row of inputs
// staying in L1). Each row's sum is made the same way whatever R is (one vector accumulator over the row, then its
// horizontal sum, then the tail; for a weight off its lines, row_streams_off_line's order, for all its rows alike): a
// row's value does not depend on the group or thread it falls in.
template <int R>
inline void row_streams(const float* w, const float* x, const float* b, float* y, int64_t I, int64_t first,
                        int64_t per) {
  using V = Wide;
#if defined(__AVX512F__)
  const auto offset = static_cast<int64_t>(reinterpret_cast<uintptr_t>(w + first * I) % 64);
  if (I % 16 == 0 && offset != 0 && offset % 4 == 0)  // (every row at the same offset in its line)
    return row_streams_off_line<R>(w, x, b, y, I, first, per, 16 - offset / 4);
#endif
  const int64_t stream = per * I;  // floats between a row and the same row of the next stream
  for (int64_t j = 0; j < per; ++j) {
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = V::zero();
    const float* rows = w + (first + j) * I;
    int64_t i = 0;
    for (; i + V::W <= I; i += V::W) {
      const V xi = V::load(x + i);
      for (int r = 0; r < R; ++r) acc[r] = fma(V::load(rows + r * stream + i), xi, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      float sum = acc[r].sum();
      for (int64_t t = i; t < I; ++t) sum += rows[r * stream + t] * x[t];
      const int64_t row = first + r * per + j;
      y[row] = b == nullptr ? sum : sum + b[row];
    }
  }
}

// Rows [begin, end) of y = w x + b (b may be null) for a row-major weight w [out, I]. The range is contiguous memory;
// cut into four parts read side by side, it makes four long sequential streams, which the hardware prefetcher
// follows from page to page, where eight neighbouring rows at a time made eight streams that started over on every
// row (docs/performance-log.md has the rates). Short rows sixteen at a time.
inline void linear_rows(const float* w, const float* x, const float* b, float* y, int64_t I, int64_t begin,
                        int64_t end) {
  constexpr int R = 4;
  int64_t o = begin;
#if defined(__AVX512F__)
  if (I <= kShortRow) o = short_rows_linear(w, x, b, y, I, begin, end);
#endif
  const int64_t per = (end - o) / R;
  row_streams<R>(w, x, b, y, I, o, per);
  o += R * per;
  row_streams<1>(w, x, b, y, I, o, end - o);  // the remaining rows (fewer than R), one stream
}

// A linear layer for one row (decoding at batch 1): output[o] = weight[o] . input (+ bias[o]) for a row-major weight
// [out, in]. Bound by reading the weight: each thread streams a contiguous range of its rows (`linear_rows`). BLAS's
// matrix-vector product reads such a weight at half the memory's rate on some CPUs and near it on others
// (docs/performance-log.md); this reads it the same way everywhere.
at::Tensor row_linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.device().is_cpu() && weight.device().is_cpu() && input.scalar_type() == at::kFloat &&
                  weight.scalar_type() == at::kFloat && input.is_contiguous() && weight.is_contiguous() &&
                  weight.dim() == 2 && input.numel() == weight.size(1),
              "row_linear: a contiguous float32 CPU row of `in` inputs and weight [out, in] expected");
  const bool with_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!with_bias || (bias->device().is_cpu() && bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                             bias->numel() == weight.size(0)),
              "row_linear: a contiguous float32 CPU bias of `out` values expected");
  const int64_t O = weight.size(0), I = weight.size(1);
  auto output = at::empty({O}, input.options());
  const float* x = input.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* b = with_bias ? bias->data_ptr<float>() : nullptr;
  float* y = output.data_ptr<float>();
  at::parallel_for(0, O, std::max<int64_t>(4, 32768 / std::max<int64_t>(1, I)),
                   [&](int64_t begin, int64_t end) { linear_rows(w, x, b, y, I, begin, end); });
  return output;
}

// y = (x - mean) / sqrt(variance + eps) * gain + shift over one row of E floats (the moments in double); y may be x.
inline void layer_norm_row(const float* x, const float* gain, const float* shift, double eps, int64_t E, float* y) {
  double sum = 0.0, squares = 0.0;
  for (int64_t i = 0; i < E; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(E);
  for (int64_t i = 0; i < E; ++i) squares += (x[i] - mean) * (x[i] - mean);
  const float scale = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(E) + eps));
  const float center = static_cast<float>(mean);
  for (int64_t i = 0; i < E; ++i) y[i] = (x[i] - center) * scale * gain[i] + shift[i];
}

// Thread t's share [begin, end) of n items among T threads, in multiples of `align` (the last share takes the rest).
inline std::pair<int64_t, int64_t> thread_share(int64_t n, int t, int T, int64_t align) {
  const int64_t per = ((n + T - 1) / T + align - 1) / align * align;
  const int64_t begin = std::min<int64_t>(n, t * per);
  return {begin, std::min<int64_t>(n, begin + per)};
}

// One layer of decoding for one token at batch 1 (TxlLayer in inference, dropout off):
//   context = LN_a(x) (pre-LN) or x;  [q; k; v] = W_qkv context;  key[:, :, K-1] = k, value[:, :, K-1] = v
//   a = one-query relative attention of q over key, value, rel_key (u, v biases, mask, scaling)
//   post-LN: h = LN_a(x + W_o a + b_o);  out = LN_f(h + W_down relu(W_up h + b_up) + b_down)
//   pre-LN:  h = x + W_o a + b_o;        out = h + W_down relu(W_up LN_f(h) + b_up) + b_down
// The threads of one parallel region split each product's rows and the heads, with a barrier between steps, instead
// of a call (and a fork and join) for each of the dozen operators a layer is otherwise made of.
namespace {

// One layer's weights and memory as `decode_layer_steps` reads them (checked by `checked_decode_layer`).
struct DecodeLayer {
  const float *w_qkv, *w_o, *w_up, *w_down, *b_o, *b_up, *b_down, *g_a, *s_a, *g_f, *s_f, *rel, *u, *v;
  float *key, *value;
  float* input_entry;  // where the layer's input is written (the memory's hidden states), or null
  int64_t key_head, key_row, value_head, value_row, rel_head, rel_row;
  int64_t H, K, D, E, inner;
  float scale;
  double attn_eps, ffn_eps;
};

inline const float* optional_data(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined() ? tensor->data_ptr<float>() : nullptr;
}

// `name`'s checks of one layer's tensors (those of decode_layer's signature; input_entry: [1, M, E] whose last entry
// receives the layer's input, or none), and the layer as the steps read it.
DecodeLayer checked_decode_layer(const char* name, int64_t E, const at::Tensor& qkv_weight, const at::Tensor& key,
                                 const at::Tensor& value, const at::Tensor& rel_key, const at::Tensor& content_bias,
                                 const at::Tensor& position_bias, double scaling, const at::Tensor& o_weight,
                                 const std::optional<at::Tensor>& o_bias, const at::Tensor& attn_norm_weight,
                                 const at::Tensor& attn_norm_bias, double attn_norm_eps, const at::Tensor& up_weight,
                                 const std::optional<at::Tensor>& up_bias, const at::Tensor& down_weight,
                                 const std::optional<at::Tensor>& down_bias, const at::Tensor& ffn_norm_weight,
                                 const at::Tensor& ffn_norm_bias, double ffn_norm_eps,
                                 const std::optional<at::Tensor>& input_entry) {
  for (const at::Tensor* t : {&qkv_weight, &key, &value, &rel_key, &content_bias, &position_bias, &o_weight,
                              &attn_norm_weight, &attn_norm_bias, &up_weight, &down_weight, &ffn_norm_weight,
                              &ffn_norm_bias})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat, name, ": float32 CPU tensors expected");
  for (const std::optional<at::Tensor>* t : {&o_bias, &up_bias, &down_bias})
    TORCH_CHECK(!(t->has_value() && (*t)->defined()) ||
                    ((*t)->device().is_cpu() && (*t)->scalar_type() == at::kFloat && (*t)->is_contiguous()),
                name, ": float32 CPU biases expected");
  TORCH_CHECK(key.dim() == 4 && key.size(0) == 1 && value.sizes() == key.sizes() && key.stride(3) == 1 &&
                  value.stride(3) == 1 && rel_key.dim() == 3 && rel_key.stride(2) == 1,
              name, ": key / value [1, H, K, D] and rel_key [H, K, D], last dimensions contiguous, expected");
  const int64_t H = key.size(1), K = key.size(2), D = key.size(3), HD = H * D;
  const int64_t inner = up_weight.size(0);
  TORCH_CHECK(qkv_weight.is_contiguous() && o_weight.is_contiguous() && up_weight.is_contiguous() &&
                  down_weight.is_contiguous() && content_bias.is_contiguous() && position_bias.is_contiguous() &&
                  attn_norm_weight.is_contiguous() && attn_norm_bias.is_contiguous() &&
                  ffn_norm_weight.is_contiguous() && ffn_norm_bias.is_contiguous(),
              name, ": contiguous weights expected");
  TORCH_CHECK(K >= 1 && D % Vec::W == 0 && qkv_weight.dim() == 2 && qkv_weight.size(0) == 3 * HD &&
                  qkv_weight.size(1) == E && rel_key.size(0) == H && rel_key.size(1) == K && rel_key.size(2) == D &&
                  content_bias.numel() == HD && position_bias.numel() == HD && o_weight.dim() == 2 &&
                  o_weight.size(0) == E && o_weight.size(1) == HD && up_weight.dim() == 2 && up_weight.size(1) == E &&
                  down_weight.dim() == 2 && down_weight.size(0) == E && down_weight.size(1) == inner &&
                  attn_norm_weight.numel() == E && attn_norm_bias.numel() == E && ffn_norm_weight.numel() == E &&
                  ffn_norm_bias.numel() == E && (!o_bias.has_value() || !o_bias->defined() || o_bias->numel() == E) &&
                  (!up_bias.has_value() || !up_bias->defined() || up_bias->numel() == inner) &&
                  (!down_bias.has_value() || !down_bias->defined() || down_bias->numel() == E),
              name, ": mismatched shapes");
  const bool with_entry = input_entry.has_value() && input_entry->defined();
  if (with_entry)
    TORCH_CHECK(input_entry->device().is_cpu() && input_entry->scalar_type() == at::kFloat &&
                    input_entry->dim() == 3 && input_entry->size(0) == 1 && input_entry->size(1) >= 1 &&
                    input_entry->size(2) == E && input_entry->stride(2) == 1,
                name, ": the layer inputs' memory [1, M, E] (last dimension contiguous) expected");
  return DecodeLayer{
      qkv_weight.data_ptr<float>(), o_weight.data_ptr<float>(), up_weight.data_ptr<float>(),
      down_weight.data_ptr<float>(), optional_data(o_bias), optional_data(up_bias), optional_data(down_bias),
      attn_norm_weight.data_ptr<float>(), attn_norm_bias.data_ptr<float>(), ffn_norm_weight.data_ptr<float>(),
      ffn_norm_bias.data_ptr<float>(), rel_key.data_ptr<float>(), content_bias.data_ptr<float>(),
      position_bias.data_ptr<float>(), key.data_ptr<float>(), value.data_ptr<float>(),
      with_entry ? input_entry->data_ptr<float>() + (input_entry->size(1) - 1) * input_entry->stride(1) : nullptr,
      key.stride(1), key.stride(2), value.stride(1), value.stride(2), rel_key.stride(0), rel_key.stride(1),
      H, K, D, E, inner, static_cast<float>(scaling), attn_norm_eps, ffn_norm_eps};
}

// The mask [1, K] (bool) a decoding step reads, or null.
const bool* checked_decode_mask(const char* name, const std::optional<at::Tensor>& mask, int64_t K, int64_t* stride) {
  *stride = 0;
  if (!(mask.has_value() && mask->defined())) return nullptr;
  TORCH_CHECK(mask->device().is_cpu() && mask->dim() == 2 && mask->scalar_type() == at::kBool && mask->size(0) == 1 &&
                  mask->size(1) == K,
              name, ": mask [1, K] (bool) expected");
  *stride = mask->stride(1);
  return mask->data_ptr<bool>();
}

// Scratch for `decode_layer_steps` (one buffer for all threads and layers of a call, sized for the largest layer).
struct DecodeWork {
  std::vector<float> data;
  float *context, *qkv, *attended, *mid, *ffn_input, *projected, *hidden_units, *scratch;
  int64_t head_scratch;
  DecodeWork(int64_t E, int64_t HD, int64_t inner, int64_t D, int64_t K, int threads)
      : data(4 * E + 4 * HD + inner + threads * (2 * D + K + Vec::W)), head_scratch(2 * D + K + Vec::W) {
    context = data.data();        // [E] pre-LN's normed input
    qkv = context + E;            // [3 HD]
    attended = qkv + 3 * HD;      // [HD]
    mid = attended + HD;          // [E] the attention sub-layer's output
    ffn_input = mid + E;          // [E] pre-LN's normed mid
    projected = ffn_input + E;    // [E] W_o a, then W_down relu(...)
    hidden_units = projected + E;  // [inner]
    scratch = hidden_units + inner;
  }
};

// One layer's step, by thread t of the T threads of the enclosing parallel region (every thread calls it): reads x,
// writes out (E floats each, not the same); ends with a barrier, after which `out` is complete.
void decode_layer_steps(const DecodeLayer& L, const bool* hidden_keys, int64_t hidden_stride, bool pre_lnorm,
                        const float* x, float* out, const DecodeWork& w, int t, int T) {
  const int64_t H = L.H, K = L.K, D = L.D, E = L.E, HD = H * D;
  if (L.input_entry != nullptr && t == 0) std::memcpy(L.input_entry, x, E * sizeof(float));  // (read by no one here)
  if (pre_lnorm) {
#pragma omp single
    layer_norm_row(x, L.g_a, L.s_a, L.attn_eps, E, w.context);
  }
  const float* attention_input = pre_lnorm ? w.context : x;
  auto [q0, q1] = thread_share(3 * HD, t, T, 16);
  linear_rows(L.w_qkv, attention_input, nullptr, w.qkv, E, q0, q1);
#pragma omp barrier
  auto [h0, h1] = thread_share(H, t, T, 1);
  for (int64_t h = h0; h < h1; ++h) {
    float* k_h = L.key + h * L.key_head;
    float* v_h = L.value + h * L.value_head;
    std::memcpy(k_h + (K - 1) * L.key_row, w.qkv + HD + h * D, D * sizeof(float));
    std::memcpy(v_h + (K - 1) * L.value_row, w.qkv + 2 * HD + h * D, D * sizeof(float));
    one_query_head(w.qkv + h * D, k_h, L.key_row, v_h, L.value_row, L.rel + h * L.rel_head, L.rel_row, L.u + h * D,
                   L.v + h * D, hidden_keys, hidden_stride, K, D, L.scale, w.scratch + t * w.head_scratch,
                   w.attended + h * D);
  }
#pragma omp barrier
  auto [e0, e1] = thread_share(E, t, T, 16);
  linear_rows(L.w_o, w.attended, L.b_o, w.projected, HD, e0, e1);
#pragma omp barrier
#pragma omp single
  {
    for (int64_t i = 0; i < E; ++i) w.mid[i] = x[i] + w.projected[i];
    if (pre_lnorm)
      layer_norm_row(w.mid, L.g_f, L.s_f, L.ffn_eps, E, w.ffn_input);
    else
      layer_norm_row(w.mid, L.g_a, L.s_a, L.attn_eps, E, w.mid);
  }
  const float* ffn_in = pre_lnorm ? w.ffn_input : w.mid;
  auto [i0, i1] = thread_share(L.inner, t, T, 16);
  linear_rows(L.w_up, ffn_in, L.b_up, w.hidden_units, E, i0, i1);
  for (int64_t i = i0; i < i1; ++i) w.hidden_units[i] = std::max(w.hidden_units[i], 0.0f);
#pragma omp barrier
  linear_rows(L.w_down, w.hidden_units, L.b_down, w.projected, L.inner, e0, e1);
#pragma omp barrier
#pragma omp single
  {
    for (int64_t i = 0; i < E; ++i) out[i] = w.mid[i] + w.projected[i];
    if (!pre_lnorm) layer_norm_row(out, L.g_f, L.s_f, L.ffn_eps, E, out);
  }
}

inline int decode_threads() { return at::in_parallel_region() ? 1 : std::max(1, at::get_num_threads()); }

}  // namespace

// One layer's step (above) in one parallel region. hidden: E floats; key, value [1, H, K, D] whose last entry this
// writes (the memory's buffers, room made by the caller); rel_key [H, K, D]; mask [1, K] bool or none. Returns [E].
at::Tensor decode_layer(const at::Tensor& hidden, const at::Tensor& qkv_weight, const at::Tensor& key,
                        const at::Tensor& value, const at::Tensor& rel_key, const at::Tensor& content_bias,
                        const at::Tensor& position_bias, const std::optional<at::Tensor>& mask, double scaling,
                        const at::Tensor& o_weight, const std::optional<at::Tensor>& o_bias,
                        const at::Tensor& attn_norm_weight, const at::Tensor& attn_norm_bias, double attn_norm_eps,
                        const at::Tensor& up_weight, const std::optional<at::Tensor>& up_bias,
                        const at::Tensor& down_weight, const std::optional<at::Tensor>& down_bias,
                        const at::Tensor& ffn_norm_weight, const at::Tensor& ffn_norm_bias, double ffn_norm_eps,
                        bool pre_lnorm) {
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "decode_layer: a contiguous float32 CPU hidden state expected");
  const int64_t E = hidden.numel();
  const DecodeLayer layer = checked_decode_layer(
      "decode_layer", E, qkv_weight, key, value, rel_key, content_bias, position_bias, scaling, o_weight, o_bias,
      attn_norm_weight, attn_norm_bias, attn_norm_eps, up_weight, up_bias, down_weight, down_bias, ffn_norm_weight,
      ffn_norm_bias, ffn_norm_eps, std::nullopt);
  int64_t hidden_stride;
  const bool* hidden_keys = checked_decode_mask("decode_layer", mask, layer.K, &hidden_stride);
  auto output = at::empty({E}, hidden.options());
  const int threads = decode_threads();
  const DecodeWork work(E, layer.H * layer.D, layer.inner, layer.D, layer.K, threads);
  const float* x = hidden.data_ptr<float>();
  float* out = output.data_ptr<float>();
#pragma omp parallel num_threads(threads)
  decode_layer_steps(layer, hidden_keys, hidden_stride, pre_lnorm, x, out, work, omp_get_thread_num(),
                     omp_get_num_threads());
  return output;
}

// Every layer of the model for one token at batch 1, in one parallel region: `decode_layer` for each in turn, each
// layer's input also written into the last entry of its `input_entry` (the memory's hidden states, room made by the
// caller), instead of a call per layer and the Python around it. `layers`: kDecodeLayerTensors tensors per layer, in
// the order of the constants below (biases may be None); `scalars`: scaling, attn_norm_eps, ffn_norm_eps per
// layer. Every layer's keys share the mask [1, K] (or none). Returns the last layer's output [E].
// `offsets` (K, then per layer the first entry of its input's, key's and value's window), or empty: with offsets the
// memory's tensors are its whole buffers ([1, N, E], [1, H, N, D]) and rel_key a whole table [H, L >= K, D], whose
// windows (the K entries from each first one; the table's last K rows) are taken here, without a view made in Python
// for each (which costs a small model's step a tenth of its time).
constexpr int64_t kDecodeLayerTensors = 17;
at::Tensor decode_layers(const at::Tensor& hidden, const c10::List<std::optional<at::Tensor>>& layers,
                         const std::optional<at::Tensor>& mask, at::ArrayRef<double> scalars, bool pre_lnorm,
                         at::IntArrayRef offsets) {
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "decode_layers: a contiguous float32 CPU hidden state expected");
  const int64_t count = static_cast<int64_t>(layers.size()) / kDecodeLayerTensors;
  TORCH_CHECK(count >= 1 && static_cast<int64_t>(layers.size()) == count * kDecodeLayerTensors &&
                  static_cast<int64_t>(scalars.size()) == 3 * count,
              "decode_layers: ", kDecodeLayerTensors, " tensors and 3 scalars per layer expected");
  TORCH_CHECK(offsets.empty() || static_cast<int64_t>(offsets.size()) == 1 + 3 * count,
              "decode_layers: no offsets, or K and three per layer, expected");
  const int64_t E = hidden.numel();
  std::vector<std::optional<at::Tensor>> tensors(layers.begin(), layers.end());
  if (!offsets.empty()) {
    const int64_t K = offsets[0];
    TORCH_CHECK(K >= 1, "decode_layers: K >= 1 expected");
    for (int64_t l = 0; l < count; ++l) {
      const int64_t i = l * kDecodeLayerTensors;
      for (int64_t slot : {0, 2, 3, 4})
        TORCH_CHECK(tensors[i + slot].has_value() && tensors[i + slot]->defined() &&
                        tensors[i + slot]->dim() == (slot == 0 || slot == 4 ? 3 : 4),
                    "decode_layers: the memory's buffers [1, N, E], [1, H, N, D] and a table [H, L, D] expected");
      at::Tensor& input = *tensors[i];
      at::Tensor& table = *tensors[i + 4];
      TORCH_CHECK(table.size(1) >= K, "decode_layers: a table of at least K rows expected");
      // (narrow checks each window lies in its buffer)
      input = input.narrow(1, offsets[1 + 3 * l], K);
      *tensors[i + 2] = tensors[i + 2]->narrow(2, offsets[2 + 3 * l], K);
      *tensors[i + 3] = tensors[i + 3]->narrow(2, offsets[3 + 3 * l], K);
      table = table.narrow(1, table.size(1) - K, K);
    }
  }
  auto required = [&](int64_t i) -> const at::Tensor& {
    TORCH_CHECK(tensors[i].has_value() && tensors[i]->defined(), "decode_layers: tensor ", i % kDecodeLayerTensors,
                " of layer ", i / kDecodeLayerTensors, " missing");
    return *tensors[i];
  };
  std::vector<DecodeLayer> steps;
  int64_t HD = 0, inner = 0, D = 0;
  for (int64_t l = 0; l < count; ++l) {
    const int64_t i = l * kDecodeLayerTensors;
    steps.push_back(checked_decode_layer(
        "decode_layers", E, required(i + 1), required(i + 2), required(i + 3), required(i + 4), required(i + 5),
        required(i + 6), scalars[3 * l], required(i + 7), tensors[i + 8], required(i + 9), required(i + 10),
        scalars[3 * l + 1], required(i + 11), tensors[i + 12], required(i + 13), tensors[i + 14], required(i + 15),
        required(i + 16), scalars[3 * l + 2], required(i)));
    TORCH_CHECK(steps.back().K == steps.front().K, "decode_layers: every layer's memory of the same length expected");
    HD = std::max(HD, steps.back().H * steps.back().D);
    inner = std::max(inner, steps.back().inner);
    D = std::max(D, steps.back().D);
  }
  int64_t hidden_stride;
  const bool* hidden_keys = checked_decode_mask("decode_layers", mask, steps.front().K, &hidden_stride);
  auto output = at::empty({E}, hidden.options());
  const int threads = decode_threads();
  const DecodeWork work(E, HD, inner, D, steps.front().K, threads);
  std::vector<float> between(2 * E);  // the layers' outputs, alternating
  const float* x0 = hidden.data_ptr<float>();
  float* out = output.data_ptr<float>();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const float* x = x0;
    for (int64_t l = 0; l < count; ++l) {
      float* y = l + 1 == count ? out : between.data() + (l % 2) * E;
      decode_layer_steps(steps[l], hidden_keys, hidden_stride, pre_lnorm, x, y, work, t, T);
      x = y;
    }
  }
  return output;
}

// The adaptive log-softmax of one row (decoding at batch 1; TxlAdaptiveLogSoftmax.forward's contract) in one parallel
// region, instead of a dozen operator calls (each cluster's projection, product, log-softmax, the head's tail logits,
// the additions and the concatenation) with a fork and join each:
//   h_c = hidden P_c (or hidden where cluster c has no projection);  logits_c = W_c h_c + b_c
//   head: [logits_0; t] with t = T h_0 + tb (one logit per tail cluster), lp_0 = log_softmax([logits_0; t])
//   output = [lp_0[:n_0]; lp_0[n_0 + c - 1] + log_softmax(logits_c) for each tail cluster c]
// clusters: 3 per cluster (weight [n_c, d_c], bias [n_c], projection [E, d_c] or none), then T [C-1, d_0] and tb
// [C-1] where C > 1. Returns [sum n_c]. Each log-softmax is (x - max) - log(sum exp(x - max)), as torch's.
namespace {

// y[0:d) = sum over rows e of [begin, end) of x[e] w[e, 0:d) (w [., d] row-major): four streams of rows side by side,
// as linear_rows reads, into one sum per output kept in L1.
inline void rows_times_inputs(const float* w, const float* x, float* y, int64_t d, int64_t begin, int64_t end) {
  using V = Wide;
  std::fill(y, y + d, 0.0f);
  constexpr int R = 4;
  const int64_t per = (end - begin) / R;
  auto accumulate = [&](const float* row, float scale) {
    const V factor = V::bcast(&scale);
    int64_t o = 0;
    for (; o + V::W <= d; o += V::W) fma(V::load(row + o), factor, V::load(y + o)).store(y + o);
    for (; o < d; ++o) y[o] += row[o] * scale;
  };
  for (int64_t j = 0; j < per; ++j)
    for (int r = 0; r < R; ++r) {
      const int64_t e = begin + r * per + j;
      accumulate(w + e * d, x[e]);
    }
  for (int64_t e = begin + R * per; e < end; ++e) accumulate(w + e * d, x[e]);
}

}  // namespace

at::Tensor adaptive_log_softmax_row(const at::Tensor& hidden, const c10::List<std::optional<at::Tensor>>& clusters) {
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "adaptive_log_softmax_row: a contiguous float32 CPU hidden state expected");
  const int64_t E = hidden.numel(), entries = static_cast<int64_t>(clusters.size());
  const int64_t C = entries == 3 ? 1 : (entries - 2) / 3;
  TORCH_CHECK(C >= 1 && entries == 3 * C + (C > 1 ? 2 : 0),
              "adaptive_log_softmax_row: 3 tensors per cluster, then the head's tail weight and bias, expected");
  std::vector<std::optional<at::Tensor>> tensors(clusters.begin(), clusters.end());
  auto checked = [&](int64_t i, int64_t rows, int64_t columns) -> const float* {  // columns < 0: a vector of rows
    TORCH_CHECK(tensors[i].has_value() && tensors[i]->defined(), "adaptive_log_softmax_row: tensor ", i, " missing");
    const at::Tensor& t = *tensors[i];
    const bool shaped = columns < 0 ? t.dim() == 1 && t.size(0) == rows : t.dim() == 2 && t.size(0) == rows &&
                                                                               t.size(1) == columns;
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && shaped,
                "adaptive_log_softmax_row: tensor ", i, " must be a contiguous float32 CPU tensor of shape [", rows,
                columns < 0 ? "" : ", " + std::to_string(columns), "]");
    return t.data_ptr<float>();
  };
  struct Cluster {
    const float *weight, *bias, *projection;
    int64_t rows, width, first, projected;  // first: its first output; projected: its offset in the projections
  };
  std::vector<Cluster> parts;
  int64_t outputs = 0, projected = 0;
  for (int64_t c = 0; c < C; ++c) {
    TORCH_CHECK(tensors[3 * c].has_value() && tensors[3 * c]->defined() && tensors[3 * c]->dim() == 2,
                "adaptive_log_softmax_row: cluster ", c, "'s weight [n, d] missing");
    const int64_t rows = tensors[3 * c]->size(0), width = tensors[3 * c]->size(1);
    const bool has_projection = tensors[3 * c + 2].has_value() && tensors[3 * c + 2]->defined();
    TORCH_CHECK(has_projection || width == E, "adaptive_log_softmax_row: cluster ", c,
                " has no projection, so its width must be the hidden state's");
    parts.push_back({checked(3 * c, rows, width), checked(3 * c + 1, rows, -1),
                     has_projection ? checked(3 * c + 2, E, width) : nullptr, rows, width, outputs, projected});
    outputs += rows;
    if (has_projection) projected += width;
  }
  const float* tail_weight = C > 1 ? checked(3 * C, C - 1, parts[0].width) : nullptr;
  const float* tail_bias = C > 1 ? checked(3 * C + 1, C - 1, -1) : nullptr;

  auto output = at::empty({outputs}, hidden.options());
  const float* x = hidden.data_ptr<float>();
  float* out = output.data_ptr<float>();
  const int threads = decode_threads();
  // The projections' sums per thread, then their totals; the head's tail logits; each segment's maximum and
  // exponential sum per thread (segment 0: the head with its tail logits, c: cluster c).
  std::vector<float> partial(threads * projected), projections(projected), tails(std::max<int64_t>(C - 1, 1));
  std::vector<float> maxima(threads * C), sums(threads * C);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    auto [e0, e1] = thread_share(E, t, T, 16);
    for (const Cluster& c : parts)
      if (c.projection != nullptr)
        rows_times_inputs(c.projection, x, partial.data() + t * projected + c.projected, c.width, e0, e1);
#pragma omp barrier
#pragma omp single
    for (int64_t o = 0; o < projected; ++o) {
      float sum = 0.0f;
      for (int u = 0; u < T; ++u) sum += partial[u * projected + o];
      projections[o] = sum;
    }
    auto inputs = [&](const Cluster& c) { return c.projection != nullptr ? projections.data() + c.projected : x; };
    for (const Cluster& c : parts) {
      auto [r0, r1] = thread_share(c.rows, t, T, 16);
      linear_rows(c.weight, inputs(c), c.bias, out + c.first, c.width, r0, r1);
    }
    if (C > 1 && t == T - 1)  // the head's logits of the tail clusters
      linear_rows(tail_weight, inputs(parts[0]), tail_bias, tails.data(), parts[0].width, 0, C - 1);
#pragma omp barrier
    for (int64_t c = 0; c < C; ++c) {
      auto [r0, r1] = thread_share(parts[c].rows, t, T, 16);
      float maximum = row_maximum(out + parts[c].first + r0, r1 - r0);
      if (c == 0 && t == T - 1) maximum = std::max(maximum, row_maximum(tails.data(), C - 1));
      maxima[t * C + c] = maximum;
    }
#pragma omp barrier
    std::vector<float> maximum(C), log_sum(C);  // per segment: the same on every thread (the same sums, in order)
    for (int64_t c = 0; c < C; ++c) {
      maximum[c] = -FLT_MAX;
      for (int u = 0; u < T; ++u) maximum[c] = std::max(maximum[c], maxima[u * C + c]);
      auto [r0, r1] = thread_share(parts[c].rows, t, T, 16);
      float sum = exponentials<false>(out + parts[c].first + r0, r1 - r0, maximum[c]);
      if (c == 0 && t == T - 1) sum += exponentials<false>(tails.data(), C - 1, maximum[c]);
      sums[t * C + c] = sum;
    }
#pragma omp barrier
    for (int64_t c = 0; c < C; ++c) {
      float sum = 0.0f;
      for (int u = 0; u < T; ++u) sum += sums[u * C + c];
      log_sum[c] = std::log(sum);
    }
    for (int64_t c = 0; c < C; ++c) {
      auto [r0, r1] = thread_share(parts[c].rows, t, T, 16);
      float* segment = out + parts[c].first;
      if (c == 0) {
        for (int64_t k = r0; k < r1; ++k) segment[k] = (segment[k] - maximum[0]) - log_sum[0];
      } else {  // a tail token: its cluster's log-probability in the head plus its own within the cluster
        const float head = (tails[c - 1] - maximum[0]) - log_sum[0];
        for (int64_t k = r0; k < r1; ++k) segment[k] = head + ((segment[k] - maximum[c]) - log_sum[c]);
      }
    }
  }
  return output;
}

// Dropout on a counter-based random stream. Entry i of the mask drawn with `seed` keeps its input where its 16 bits
// of word i / 4 of the stream (bits 16 (i % 4) and up, read as int16: torch's view of the words as int16 on a
// little-endian machine) are >= `threshold`, with word n = splitmix64's n-th output from `seed`. A word depends on
// (seed, n) alone: any thread draws any part, and the mask is the same whatever the threads.
// kernels_txl._keep_mask is the same stream in torch operators (tests compare them).
namespace {

inline uint64_t stream_word(uint64_t seed, uint64_t n) {
  uint64_t z = seed + (n + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr int64_t kWordsPerBlock = 16;  // 64 entries: the words in one register file, the entries in a few

// The mask's entries [4 first_word, 4 last_word) (and < count): keep[i] = kept, output[i] = (input[i] kept) *
// scale, after a ReLU where kRelu. Products in the order of the torch path (x * keep, then * scale): the same bits.
template <bool kRelu>
void dropout_words(const float* input, float* output, uint8_t* keep, int64_t count, uint64_t seed, int threshold,
                   float scale, int64_t first_word, int64_t last_word) {
  uint64_t words[kWordsPerBlock];
  int16_t lanes[4 * kWordsPerBlock];
  for (int64_t w0 = first_word; w0 < last_word; w0 += kWordsPerBlock) {
    for (int64_t t = 0; t < kWordsPerBlock; ++t) words[t] = stream_word(seed, static_cast<uint64_t>(w0 + t));
    std::memcpy(lanes, words, sizeof(words));
    const int64_t i0 = 4 * w0, n = std::min<int64_t>(4 * std::min(kWordsPerBlock, last_word - w0), count - i0);
    const float* x = input + i0;
    float* y = output + i0;
    if constexpr (kRelu) {
      for (int64_t t = 0; t < n; ++t) y[t] = std::max(x[t] * static_cast<float>(lanes[t] >= threshold), 0.0f) * scale;
    } else {
      uint8_t* k = keep + i0;  // (bool's bytes: as uint8, the loop vectorises)
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t kept = lanes[t] >= threshold;
        k[t] = kept;
        y[t] = x[t] * static_cast<float>(kept) * scale;
      }
    }
  }
}

void check_dropout_input(const at::Tensor& input, const char* name) {
  TORCH_CHECK(input.device().is_cpu() && input.scalar_type() == at::kFloat && input.is_contiguous(),
              name, ": a contiguous float32 CPU tensor expected");
}

template <bool kRelu>
std::tuple<at::Tensor, at::Tensor> dropout_forward(const at::Tensor& input, int64_t seed, int64_t threshold,
                                                  double scale, const char* name) {
  check_dropout_input(input, name);
  const int64_t count = input.numel(), words = (count + 3) / 4;
  auto output = at::empty_like(input);
  auto keep = kRelu ? at::Tensor() : at::empty(input.sizes(), input.options().dtype(at::kBool));
  const float* x = input.data_ptr<float>();
  float* y = output.data_ptr<float>();
  uint8_t* k = kRelu ? nullptr : reinterpret_cast<uint8_t*>(keep.data_ptr<bool>());
  at::parallel_for(0, words, 4096, [&](int64_t begin, int64_t end) {
    dropout_words<kRelu>(x, y, k, count, static_cast<uint64_t>(seed), static_cast<int>(threshold),
                         static_cast<float>(scale), begin, end);
  });
  return {output, keep};
}

}  // namespace

// Inverted dropout of a float32 tensor: (output, keep), keep the bool mask drawn with `seed` (see above).
std::tuple<at::Tensor, at::Tensor> dropout_training_forward(const at::Tensor& input, int64_t seed, int64_t threshold,
                                                           double scale) {
  return dropout_forward<false>(input, seed, threshold, scale, "dropout_training_forward");
}

// dropout(relu(input)) with the same mask; only the output (its backward needs no more).
at::Tensor relu_dropout_training_forward(const at::Tensor& input, int64_t seed, int64_t threshold, double scale) {
  return std::get<0>(dropout_forward<true>(input, seed, threshold, scale, "relu_dropout_training_forward"));
}

// The gradient through dropout: grad_output * keep * scale. With `relu_output` instead of a mask (relu_dropout's
// backward): grad_output * scale where the output is not <= 0 (ReLU's threshold_backward), else 0.
at::Tensor dropout_training_backward(const at::Tensor& grad_output, const at::Tensor& saved, double scale) {
  check_dropout_input(grad_output, "dropout_training_backward");
  TORCH_CHECK(saved.is_contiguous() && saved.sizes() == grad_output.sizes() &&
                  (saved.scalar_type() == at::kBool || saved.scalar_type() == at::kFloat),
              "dropout_training_backward: a contiguous bool mask or float32 output of the gradient's shape expected");
  auto grad_input = at::empty_like(grad_output);
  const float* __restrict g = grad_output.data_ptr<float>();
  float* __restrict out = grad_input.data_ptr<float>();
  const float s = static_cast<float>(scale);
  if (saved.scalar_type() == at::kBool) {
    const uint8_t* __restrict k = reinterpret_cast<const uint8_t*>(saved.data_ptr<bool>());
    at::parallel_for(0, grad_output.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = g[i] * static_cast<float>(k[i]) * s;
    });
  } else {
    const float* y = saved.data_ptr<float>();
    at::parallel_for(0, grad_output.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float scaled = g[i] * s;  // computed either way: a select, not a branch on random signs
        out[i] = y[i] <= 0.0f ? 0.0f : scaled;
      }
    });
  }
  return grad_input;
}

// The namespace is a macro (-DTXL_NAMESPACE=...): these wrappers expand it before torch's macros see it (before
// torch 2.11 TORCH_LIBRARY stringised its argument as written, defining the operators under "TXL_NAMESPACE").
#define TXL_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define TXL_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

TXL_LIBRARY(TXL_NAMESPACE, m) {
  m.def("relative_attention_inference(Tensor query, Tensor key, Tensor value, Tensor rel_key, Tensor content_bias, "
        "Tensor position_bias, Tensor mask, float scaling) -> Tensor");
  m.def("relative_attention_one_query(Tensor query, Tensor key, Tensor value, Tensor rel_key, Tensor content_bias, "
        "Tensor position_bias, Tensor? mask, float scaling) -> Tensor");
  m.def("relative_attention_training_forward(Tensor query, Tensor key, Tensor value, Tensor rel_key, "
        "Tensor content_bias, Tensor position_bias, Tensor mask, float scaling) -> (Tensor, Tensor)");
  m.def("relative_attention_score_grad(Tensor grad_output, Tensor output, Tensor value, Tensor probs) -> Tensor");
  m.def("row_linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
  m.def("decode_layer(Tensor hidden, Tensor qkv_weight, Tensor(a!) key, Tensor(b!) value, Tensor rel_key, "
        "Tensor content_bias, Tensor position_bias, Tensor? mask, float scaling, Tensor o_weight, Tensor? o_bias, "
        "Tensor attn_norm_weight, Tensor attn_norm_bias, float attn_norm_eps, Tensor up_weight, Tensor? up_bias, "
        "Tensor down_weight, Tensor? down_bias, Tensor ffn_norm_weight, Tensor ffn_norm_bias, float ffn_norm_eps, "
        "bool pre_lnorm) -> Tensor");
  m.def("decode_layers(Tensor hidden, Tensor(a!)?[] layers, Tensor? mask, float[] scalars, bool pre_lnorm, "
        "int[] offsets=[]) -> Tensor");
  m.def("adaptive_log_softmax_row(Tensor hidden, Tensor?[] clusters) -> Tensor");
  m.def("dropout_training_forward(Tensor input, int seed, int threshold, float scale) -> (Tensor, Tensor)");
  m.def("relu_dropout_training_forward(Tensor input, int seed, int threshold, float scale) -> Tensor");
  m.def("dropout_training_backward(Tensor grad_output, Tensor saved, float scale) -> Tensor");
}
TXL_LIBRARY_IMPL(TXL_NAMESPACE, CPU, m) {
  m.impl("relative_attention_inference", &relative_attention_inference);
  m.impl("relative_attention_one_query", &relative_attention_one_query);
  m.impl("relative_attention_training_forward", &relative_attention_training_forward);
  m.impl("relative_attention_score_grad", &relative_attention_score_grad);
  m.impl("row_linear", &row_linear);
  m.impl("decode_layer", &decode_layer);
  m.impl("decode_layers", &decode_layers);
  m.impl("adaptive_log_softmax_row", &adaptive_log_softmax_row);
  m.impl("dropout_training_forward", &dropout_training_forward);
  m.impl("relu_dropout_training_forward", &relu_dropout_training_forward);
  m.impl("dropout_training_backward", &dropout_training_backward);
}
"""

_ENABLE_VARIABLE = "TRANSFOXL_CPU_KERNEL"  # "0" turns the kernel off
_CACHE_VARIABLE = "TRANSFOXL_KERNEL_CACHE"  # where built kernels are kept
_lock = threading.Lock()
_built: dict[str, object | None] = {}  # build key -> the operators, or None where building failed


def supported_here() -> bool:
    """Whether this machine can build and run the kernel: Linux on x86-64, torch dispatching to AVX2 or AVX-512
    (`ATEN_CPU_CAPABILITY` lowers that), and the kernel not turned off with TRANSFOXL_CPU_KERNEL=0. (Called for every
    layer of every forward: the machine's part is looked up once.)"""
    enabled = os.environ.get(_ENABLE_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")
    return enabled and _machine_supported()


@functools.cache
def _machine_supported() -> bool:
    return (
        sys.platform.startswith("linux")
        and platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    )


def cache_folder() -> Path:
    """Where built kernels are kept: $TRANSFOXL_KERNEL_CACHE, else transfoxl/kernels under $XDG_CACHE_HOME or
    ~/.cache."""
    if os.environ.get(_CACHE_VARIABLE):
        return Path(os.environ[_CACHE_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transfoxl" / "kernels"


def _compiler() -> list[str]:
    """$CXX (split as a shell would: "ccache g++" is a compiler and an argument), else `c++`."""
    return list(_compiler_for(os.environ.get("CXX") or ""))


@functools.cache
def _compiler_for(cxx: str) -> tuple[str, ...]:
    return tuple(shlex.split(cxx)) or ("c++",)


@functools.cache
def _compile_flags(capability: str) -> tuple[str, ...]:
    """The flags torch's extensions get (C++20, PIC, OpenMP for at::parallel_for, the C++ ABI torch was built with,
    its headers and libraries) plus AVX2, and AVX-512VL (32 registers) and DQ (vector 64-bit products: the dropout
    stream) where torch dispatches to AVX-512 (it does where the CPU has VL, BW and DQ). The paths are those
    `torch.utils.cpp_extension` gives, found without importing it (it imports setuptools: over a second, and absent
    from some environments)."""
    torch_folder = Path(torch.__file__).parent
    include_paths = [torch_folder / "include", torch_folder / "include" / "torch" / "csrc" / "api" / "include"]
    vector_flags = ["-mavx2", "-mfma"] + (["-mavx512f", "-mavx512vl", "-mavx512dq"] if capability == "AVX512" else [])
    return (
        "-O3",
        f"-std={_cxx_standard()}",
        "-shared",
        "-fPIC",
        "-fopenmp",
        *vector_flags,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-isystem{path}" for path in include_paths),
        f"-L{torch_folder / 'lib'}",
    )


def _cxx_standard() -> str:
    """The C++ standard torch was built with, as its own extension builder chooses (c++17 for torch 2.11, c++20 for
    2.13), as a library built against torch's headers should be. The source is C++17. (On a GPU machine's image,
    torch 2.11 and GCC 13.3, one operator's refusal crashed the process built either way: see
    tools/kernel_error_probe.py.)"""
    found = re.search(r"C\+\+ Version: (\d{4})", torch.__config__.show())
    return "c++20" if found and int(found.group(1)) >= 2020 else "c++17"


def _compile_command(source: Path, library: Path, namespace: str) -> list[str]:
    """The compiler's command line for `source` into `library`, its operators in `namespace`."""
    flags = _compile_flags(torch.backends.cpu.get_cpu_capability())
    return [
        *_compiler(),
        *flags,
        f"-DTXL_NAMESPACE={namespace}",
        str(source),
        "-o",
        str(library),
        "-lc10",
        "-ltorch_cpu",
    ]


def _build_key() -> str:
    """Names a build: the source, torch's version, the compiler asked for and every flag given to it. (Asked for by
    every kernel call, a few hundred per decoded token: only the environment is read each time.)"""
    return _build_key_for(os.environ.get("CXX") or "", torch.backends.cpu.get_cpu_capability())


@functools.cache
def _build_key_for(cxx: str, capability: str) -> str:
    parts = [SOURCE, torch.__version__, *_compiler_for(cxx), *_compile_flags(capability)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


OPERATORS = (
    "relative_attention_inference",
    "relative_attention_one_query",
    "relative_attention_training_forward",
    "relative_attention_score_grad",
    "row_linear",
    "decode_layer",
    "decode_layers",
    "adaptive_log_softmax_row",
    "dropout_training_forward",
    "relu_dropout_training_forward",
    "dropout_training_backward",
)


def _registered(namespace: str) -> object | None:
    """The operators of a build this process has loaded already (from any folder: this package's or a remote-code
    copy's module), or None. A second library registering the same operators would abort the process."""
    try:
        for name in OPERATORS:
            getattr(getattr(torch.ops, namespace), name)  # raises if not registered
    except (AttributeError, RuntimeError):
        return None
    return getattr(torch.ops, namespace)


class KernelUnavailable(RuntimeError):
    """Why the kernel cannot be had here: no compiler, an unwritable cache, a failed build (now or earlier)."""


def _build(key: str) -> object:
    """Compile (unless a kept build exists) and load the kernel; returns its operators. Raises KernelUnavailable
    (or what loading the library raises) where that fails."""
    namespace = f"transfoxl_{key}"
    if (operators := _registered(namespace)) is not None:
        return operators
    library = cache_folder() / f"{namespace}.so"
    failed = library.with_suffix(".failed")  # a build that failed here, kept so later processes do not retry it
    if not library.is_file():
        if failed.is_file():
            raise KernelUnavailable(f"its build failed earlier, see {failed}; delete that file to try again")
        compiler = _compiler()
        if shutil.which(compiler[0]) is None:
            raise KernelUnavailable(f"no C++ compiler: {compiler[0]!r} not found ($CXX, else c++ on PATH)")
        try:
            library.parent.mkdir(parents=True, exist_ok=True)
            building = tempfile.TemporaryDirectory(dir=library.parent, prefix=".building-")
        except OSError as error:
            raise KernelUnavailable(
                f"cannot write the kernel cache {library.parent} ({error.strerror}); set {_CACHE_VARIABLE} to a "
                "writable folder"
            ) from error
        # Said once (the build is kept): the first long forward otherwise pauses unexplained.
        logger.warning(
            "transfoxl: building its CPU kernels (attention, dropout) into %s (once for this torch installation, "
            "about 10 s; TRANSFOXL_CPU_KERNEL=0 skips it).",
            library,
        )
        # Compiled in a private folder and moved in whole: a build cut short, or another process building the
        # same kernel at the same time, never leaves a partial library under the kept name.
        with building as folder:
            source, partial = Path(folder) / "relative_attention.cpp", Path(folder) / library.name
            source.write_text(SOURCE)
            command = _compile_command(source, partial, namespace)
            completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if completed.returncode != 0:
                errors = "\n".join(completed.stderr.strip().splitlines()[-20:])
                message = f"{shlex.join(compiler)} exited with status {completed.returncode}" + (
                    f":\n{errors}" * bool(errors)
                )
                failed.write_text(f"{shlex.join(command)}\n\n{message}\n")
                raise KernelUnavailable(f"{message}\n(kept in {failed}: delete it to try again)")
            os.replace(partial, library)
    torch.ops.load_library(str(library))
    if (operators := _registered(namespace)) is None:  # (loaded, but its operators are not where they should be)
        raise KernelUnavailable(f"{library} loaded but registered no {namespace} operators")
    return operators


def compiled_operators() -> object | None:
    """The compiled kernel's operators, built on the first call (`OPERATORS`: attention for a segment of queries,
    for decoding and for training's forward; dropout's forward and backward), `torch.ops.transfoxl_<key>.*` (SOURCE
    has their contracts); None where `supported_here()` is False or building failed (a warning says why, once a
    process)."""
    if not supported_here():
        return None
    key = _build_key()
    if key in _built:
        return _built[key]
    with _lock:
        if key not in _built:
            try:
                _built[key] = _build(key)
            except Exception as error:  # whatever keeps the kernel away, the model goes on by the torch paths
                logger.warning(
                    "transfoxl: the CPU kernels (attention, dropout) are not available (%s); CPU inference and "
                    "training use the torch paths (the same results, slower on small models). TRANSFOXL_CPU_KERNEL=0 "
                    "turns the kernels off.",
                    error,
                )
                _built[key] = None
    return _built[key]
