// bf16 training's causal attention on the CPU, as bf16 matmuls (torch's, oneDNN's bf16 GEMMs) around two fused
// row kernels written here: the causal softmax of the scores, in place (forward, and again in the backward: the
// probabilities are recomputed, not kept, as a flash kernel does), and the softmax's backward, dS = P (dP - D).
// Called by src/eto_train/training/attention_kernel.py for rows up to its MAX_LEN tokens.
//
// Written by hand because torch's CPU flash-attention kernel does not use the CPU's bf16 dot products: on this
// box (AMD EPYC Zen 4, AVX512-BF16, no AMX) it ran a 640-token row's 9 heads at ~100 GFLOP/s in bf16 as in fp32,
// where a bf16 batched matmul of the same shapes runs at 600-780; and as plain torch ops the softmax and its
// backward (casts, masks, exp) cost more than the matmuls saved (docs/lab/bench.md). The scores are rounded to bf16 by
// the matmul before the softmax (as transformers' eager attention under autocast does); the softmax is taken in
// fp32. Rows are [groups of query heads x positions]: row r is position r % L and sees keys 0..r % L.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cmath>
#include <limits>

#include "vec16.h"

namespace {
using namespace eto_vec;

// one row: keys 0..n-1 of the row's L columns kept, the rest zeroed
void softmax_row(bf16* s, int64_t n, int64_t L, float scale) {
  int64_t t = 0;
#ifdef __AVX512F__
  __m512 sc = _mm512_set1_ps(scale), mv = _mm512_set1_ps(NEG_INF);
  for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, load16(s + t));
  if (t < n) mv = _mm512_mask_max_ps(mv, (__mmask16)((1u << (n - t)) - 1), mv, load16(s + t, (__mmask16)((1u << (n - t)) - 1)));
  const float m = _mm512_reduce_max_ps(mv) * scale;
  __m512 mm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
  for (t = 0; t + 16 <= n; t += 16) sum = _mm512_add_ps(sum, exp16(_mm512_fmsub_ps(load16(s + t), sc, mm)));
  __mmask16 tail = (__mmask16)((1u << (n - t)) - 1);
  if (t < n) sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, exp16(_mm512_fmsub_ps(load16(s + t, tail), sc, mm))));
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
  for (t = 0; t + 16 <= n; t += 16) store16(s + t, _mm512_mul_ps(exp16(_mm512_fmsub_ps(load16(s + t), sc, mm)), inv));
  if (t < n) store16(s + t, _mm512_mul_ps(exp16(_mm512_fmsub_ps(load16(s + t, tail), sc, mm)), inv), tail);
  t = n;
#else
  float m = NEG_INF;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<float>(s[j]) * scale);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<float>(s[j]) * scale - m);
  for (int64_t j = 0; j < n; ++j) s[j] = std::exp(static_cast<float>(s[j]) * scale - m) / sum;
  t = n;
#endif
  std::fill(s + t, s + L, bf16(0.f));
}
}  // namespace

// s: [batch, rows, L] bf16 contiguous, row r's query at position r % L: causal softmax(scale * s) in place
void causal_softmax_(at::Tensor s, double scale) {
  TORCH_CHECK(s.scalar_type() == at::kBFloat16 && s.is_contiguous() && s.dim() == 3, "s: contiguous bf16 [b, rows, L]");
  const int64_t L = s.size(2), rows = s.size(0) * s.size(1);
  bf16* p = s.data_ptr<bf16>();
  at::parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) softmax_row(p + r * L, r % L + 1, L, static_cast<float>(scale));
  });
}

// dp <- p * (dp - d[row]) * scale (the gradient of the scores; zero past each row's position as p is)
void causal_softmax_backward_(at::Tensor p, at::Tensor dp, at::Tensor d, double scale) {
  TORCH_CHECK(p.scalar_type() == at::kBFloat16 && dp.scalar_type() == at::kBFloat16 && p.is_contiguous() &&
              dp.is_contiguous() && p.sizes() == dp.sizes(), "p, dp: contiguous bf16 of one shape");
  auto df = d.to(at::kFloat).contiguous();
  const int64_t L = p.size(-1), rows = p.numel() / L;
  TORCH_CHECK(df.numel() == rows, "d: one value per row");
  const bf16* pp = p.data_ptr<bf16>();
  bf16* gp = dp.data_ptr<bf16>();
  const float* dd = df.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t n = r % L + 1;
      const bf16* pr = pp + r * L;
      bf16* gr = gp + r * L;
      int64_t t = 0;
#ifdef __AVX512F__
      const __m512 dv = _mm512_set1_ps(dd[r]), s = _mm512_set1_ps(sc);
      for (; t + 16 <= n; t += 16)
        store16(gr + t, _mm512_mul_ps(_mm512_mul_ps(load16(pr + t), _mm512_sub_ps(load16(gr + t), dv)), s));
      if (t < n) {
        __mmask16 m = (__mmask16)((1u << (n - t)) - 1);
        store16(gr + t, _mm512_mul_ps(_mm512_mul_ps(load16(pr + t, m), _mm512_sub_ps(load16(gr + t, m), dv)), s), m);
      }
#else
      for (; t < n; ++t) gr[t] = static_cast<float>(pr[t]) * (static_cast<float>(gr[t]) - dd[r]) * sc;
#endif
      std::fill(gr + n, gr + L, bf16(0.f));
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("causal_softmax_", &causal_softmax_);
  m.def("causal_softmax_backward_", &causal_softmax_backward_);
}
