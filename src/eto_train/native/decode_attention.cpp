// Decode attention on the CPU: one new token per row (its query heads grouped by key-value head) over the
// row's own keys and values in its slot of the KV engine's buffers (src/eto_train/rollouts/kvbatch.py), each row
// read to its own length, returning the output and the log-sum-exp (fp32) so that the caller joins it with the
// attention over the play's shared prefix.
//
// Written by hand because no maintained library does this on the CPU: torch's CPU flash-attention kernel (the
// one SDPA calls) works in blocks of queries, and a decode step has 3 queries per key-value head (SmolLM2-135M:
// 9 heads on 3), so its per-block work dominates and it read the cache at 12-17 GB/s where the box reads
// 37 GB/s; as batched matmuls it was no faster (docs/lab/bench.md). vLLM-CPU has such a kernel inside its engine
// only. This one reads each key and value once: the scores of 16 keys at a time (one vector each, summed by a
// transpose), a vectorized softmax, then the values. AVX-512 where the compiler targets it (-march=native), plain
// loops elsewhere. Built at first use by torch.utils.cpp_extension (src/eto_train/native.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vec16.h"

namespace {
using namespace eto_vec;

// one (row, key-value head): g queries (scaled) over n keys/values, rows `ks`/`vs` apart
template <typename T>
void attend(const float* q, const T* k, const T* v, int64_t ks, int64_t vs, int64_t n, int64_t g, int64_t d,
            float* s, float* acc, float* out, float* lse) {
#ifdef __AVX512F__
  if (d % 16 == 0 && d <= 256) {
    const int64_t c = d / 16;
    __m512 blk[16];
    for (int64_t j = 0; j < g; ++j) {
      __m512 qv[16];
      for (int64_t i = 0; i < c; ++i) qv[i] = _mm512_loadu_ps(q + j * d + 16 * i);
      float* sj = s + j * n;
      int64_t t = 0;
      for (; t + 16 <= n; t += 16) {
        for (int u = 0; u < 16; ++u) {
          const T* kt = k + (t + u) * ks;
          __m512 a = _mm512_mul_ps(qv[0], load16(kt));
          for (int64_t i = 1; i < c; ++i) a = _mm512_fmadd_ps(qv[i], load16(kt + 16 * i), a);
          blk[u] = a;
        }
        _mm512_storeu_ps(sj + t, sum16(blk));
      }
      for (; t < n; ++t) {
        const T* kt = k + t * ks;
        __m512 a = _mm512_mul_ps(qv[0], load16(kt));
        for (int64_t i = 1; i < c; ++i) a = _mm512_fmadd_ps(qv[i], load16(kt + 16 * i), a);
        sj[t] = _mm512_reduce_add_ps(a);
      }
      // the softmax numerators in place of the scores, the log-sum-exp, 1/sum (in acc)
      __m512 mv = _mm512_set1_ps(NEG_INF);
      int64_t t16 = n / 16 * 16;
      for (t = 0; t < t16; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sj + t));
      float m = _mm512_reduce_max_ps(mv);
      for (t = t16; t < n; ++t) m = std::max(m, sj[t]);
      __m512 mm = _mm512_set1_ps(m), sv = _mm512_setzero_ps();
      for (t = 0; t < t16; t += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sj + t), mm));
        _mm512_storeu_ps(sj + t, e);
        sv = _mm512_add_ps(sv, e);
      }
      float sum = _mm512_reduce_add_ps(sv);
      for (t = t16; t < n; ++t) { sj[t] = std::exp(sj[t] - m); sum += sj[t]; }
      lse[j] = m + std::log(sum);
      acc[j] = 1.f / sum;
    }
    // out[j] = sum_t p[j][t] v[t] / sum[j]
    if (g <= 4 && c <= 4) {
      __m512 o[4][4];
      for (int64_t j = 0; j < g; ++j) for (int64_t i = 0; i < c; ++i) o[j][i] = _mm512_setzero_ps();
      for (int64_t t = 0; t < n; ++t) {
        const T* vt = v + t * vs;
        __m512 vv[4];
        for (int64_t i = 0; i < c; ++i) vv[i] = load16(vt + 16 * i);
        for (int64_t j = 0; j < g; ++j) {
          __m512 p = _mm512_set1_ps(s[j * n + t]);
          for (int64_t i = 0; i < c; ++i) o[j][i] = _mm512_fmadd_ps(p, vv[i], o[j][i]);
        }
      }
      for (int64_t j = 0; j < g; ++j) {
        __m512 inv = _mm512_set1_ps(acc[j]);
        for (int64_t i = 0; i < c; ++i) _mm512_storeu_ps(out + j * d + 16 * i, _mm512_mul_ps(o[j][i], inv));
      }
    } else {
      for (int64_t j = 0; j < g; ++j) {
        const float inv = acc[j];
        float* sj = s + j * n;
        for (int64_t i = 0; i < c; ++i) {
          __m512 o = _mm512_setzero_ps();
          for (int64_t t = 0; t < n; ++t) o = _mm512_fmadd_ps(_mm512_set1_ps(sj[t]), load16(v + t * vs + 16 * i), o);
          _mm512_storeu_ps(out + j * d + 16 * i, _mm512_mul_ps(o, _mm512_set1_ps(inv)));
        }
      }
    }
    return;
  }
#endif
  // any other machine or head size: the same two passes in plain loops
  for (int64_t j = 0; j < g; ++j) {
    float* sj = s + j * n;
    float m = NEG_INF;
    for (int64_t t = 0; t < n; ++t) {
      float a = 0.f;
      for (int64_t i = 0; i < d; ++i) a += q[j * d + i] * static_cast<float>(k[t * ks + i]);
      sj[t] = a;
      m = std::max(m, a);
    }
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) { sj[t] = std::exp(sj[t] - m); sum += sj[t]; }
    lse[j] = m + std::log(sum);
    for (int64_t i = 0; i < d; ++i) acc[i] = 0.f;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < d; ++i) acc[i] += sj[t] * static_cast<float>(v[t * vs + i]);
    for (int64_t i = 0; i < d; ++i) out[j * d + i] = acc[i] / sum;
  }
}

template <typename T>
void run(const float* q, const at::Tensor& k, const at::Tensor& v, const int64_t* slots, const int64_t* lengths,
         int64_t b, int64_t heads, int64_t g, int64_t d, int64_t start, float* out, float* lse) {
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  at::parallel_for(0, b * heads, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s, acc(std::max(g, d));
    for (int64_t w = lo; w < hi; ++w) {
      const int64_t r = w / heads, h = w % heads, n = lengths[r] - start;
      if (n <= 0) {
        std::fill(out + w * g * d, out + (w + 1) * g * d, 0.f);
        std::fill(lse + w * g, lse + (w + 1) * g, NEG_INF);
        continue;
      }
      s.resize(g * n);
      attend<T>(q + w * g * d, kp + slots[r] * k.stride(0) + h * k.stride(1) + start * k.stride(2),
                vp + slots[r] * v.stride(0) + h * v.stride(1) + start * v.stride(2), k.stride(2), v.stride(2),
                n, g, d, s.data(), acc.data(), out + w * g * d, lse + w * g);
    }
  });
}
}  // namespace

// q: [rows, kv_heads, g, d] (a row's query heads grouped by key-value head); k, v: the buffers
// [slots, kv_heads, capacity, d] (float32 or bfloat16, any strides but the last); row i reads slot slots[i]'s
// positions start..lengths[i]-1. Returns (out [rows, kv_heads, g, d], log-sum-exp [rows, kv_heads, g]), both
// float32; a row with no position past start gives zeros and -inf (the shared prefix is then all it attends to).
std::vector<at::Tensor> decode_attention(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor slots,
                                         at::Tensor lengths, int64_t start, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v: 4-D");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "k, v: last dim contiguous");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "k, v: one dtype");
  auto qf = (q.to(at::kFloat) * scale).contiguous();
  auto sl = slots.to(at::kLong).contiguous();
  auto ln = lengths.to(at::kLong).contiguous();
  const int64_t b = q.size(0), heads = q.size(1), g = q.size(2), d = q.size(3);
  auto out = at::empty(qf.sizes(), qf.options());
  auto lse = at::empty({b, heads, g}, qf.options());
  if (k.scalar_type() == at::kFloat)
    run<float>(qf.data_ptr<float>(), k, v, sl.data_ptr<int64_t>(), ln.data_ptr<int64_t>(), b, heads, g, d, start,
               out.data_ptr<float>(), lse.data_ptr<float>());
  else if (k.scalar_type() == at::kBFloat16)
    run<c10::BFloat16>(qf.data_ptr<float>(), k, v, sl.data_ptr<int64_t>(), ln.data_ptr<int64_t>(), b, heads, g, d,
                       start, out.data_ptr<float>(), lse.data_ptr<float>());
  else
    TORCH_CHECK(false, "k, v: float32 or bfloat16");
  return {out, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode_attention", &decode_attention); }
