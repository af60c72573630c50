// One Llama-family decoder layer for 1..16 new tokens of one sequence, fp32, in one call.
//
// Why: with the thin-matrix products at the memory bound (~22 ms for the default target's stack on
// 2 cores), the rest of a lean decode step was ~17 ms of small tensor ops: ~25 per layer, each a
// Python frame, a dispatcher call and often a wake-up of the second thread, for vectors of 576
// floats. Here RMSNorm, Qwen3's per-head q/k norms, rotary, the KV-cache write, grouped-query
// attention, SiLU-and-multiply and both residual adds run as plain loops between the four weight
// products (which call the kernel of smallm.cpp directly); llama.cpp's CPU path is built the same way.
//
// Numerics: the same fp32 formulas as transformers (RMSNorm with the weight applied after the
// normalisation, softmax after subtracting the row maximum); sums run in another order, so results
// equal transformers to float rounding (tests/targets/test_lean.py compares every path).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);  // smallm.cpp

namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t k = 0;
  __m256 acc = _mm256_setzero_ps();
  for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float r = hsum8(acc);
  for (; k < n; ++k) r += a[k] * b[k];
  return r;
}

inline void axpy(float a, const float* x, float* y, int64_t n) {  // y += a * x
  int64_t k = 0;
  const __m256 av = _mm256_set1_ps(a);
  for (; k + 8 <= n; k += 8) _mm256_storeu_ps(y + k, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k)));
  for (; k < n; ++k) y[k] += a * x[k];
}

// e^x for 8 floats, x clamped to [-87, 88]: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for exactness),
// e^r by Cephes' degree-6 polynomial for expf, 2^n through the exponent bits; relative error ~1e-7 (float
// rounding). Why: the softmax and SiLU called the scalar std::exp once per score and per MLP unit (~0.8 M calls
// per 8-row verify of the default target, ~5 ms of its ~40).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
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
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// s[j] <- e^(s[j] - mx), 0 where s[j] is -inf (a blocked key); returns the sum
inline float exp_shifted(float* s, int64_t T, float mx) {
  const __m256 m = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= T; j += 8) {
    const __m256 v = _mm256_loadu_ps(s + j);
    const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(v, ninf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(v, m)));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum8(acc);
  for (; j < T; ++j) {
    s[j] = std::isinf(s[j]) ? 0.f : std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// Eight dot products of one query row with keys K[0..7] ([8, D] row-major, D a multiple of 8), as one vector.
// Why: one key at a time ran a chain of D/8 dependent FMAs and a horizontal sum per key; eight independent
// accumulators and one transposing reduction keep both FMA pipes busy. With the register-held value sums
// below and the vectorised max and normalisation, measured on the 2-core AMD VM (default target, 300-token
// context, both builds in one process, interleaved): 8-row verify 17.99 -> 16.52 ms, 4 rows 13.94 -> 13.83,
// 1 row 12.71 -> 12.65. Attention work grows with rows x context, so wide verifies gain most.
inline __m256 dot8(const float* q, const float* K, int64_t D) {
  __m256 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
  for (int64_t v = 0; v < D; v += 8) {
    const __m256 qv = _mm256_loadu_ps(q + v);
    for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + r * D + v), a[r]);
  }
  // hadd pairs twice: u0 = [sums of a0..a3 over lanes 0-3 | over lanes 4-7], u1 the same for a4..a7
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// o[0..D) = sum_j w[j] * V[j] over the T keys with w[j] != 0, 64 output floats at a time held in registers (D a
// multiple of 64; axpy per key otherwise), so o is not loaded and stored once per key.
inline void weighted_rows(const float* w, const float* V, int64_t T, int64_t D, float* o) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 acc[8];
    for (int v = 0; v < 8; ++v) acc[v] = _mm256_setzero_ps();
    for (int64_t j = 0; j < T; ++j) {
      if (w[j] == 0.f) continue;
      const __m256 wj = _mm256_set1_ps(w[j]);
      const float* vr = V + j * D + d0;
      for (int v = 0; v < 8; ++v) acc[v] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vr + 8 * v), acc[v]);
    }
    for (int v = 0; v < 8; ++v) _mm256_storeu_ps(o + d0 + 8 * v, acc[v]);
  }
  if (d0 < D)
    for (int64_t j = 0; j < T; ++j)
      if (w[j] != 0.f) axpy(w[j], V + j * D + d0, o + d0, D - d0);
}

// a[i] = silu(g[i]) * u[i] for n floats
inline void silu_mul(const float* g, const float* u, float* a, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 z = _mm256_loadu_ps(g + i);
    const __m256 sig = _mm256_div_ps(z, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), z))));
    _mm256_storeu_ps(a + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

// y = w * x / sqrt(mean(x^2) + eps), per row of n floats (transformers' LlamaRMSNorm in fp32)
inline void rms(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float r = 1.f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t k = 0; k < n; ++k) y[k] = w[k] * (x[k] * r);
}

torch::Tensor rows_rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {  // [N, H]
  auto y = torch::empty_like(x);
  const int64_t n = x.size(0), h = x.size(1);
  for (int64_t m = 0; m < n; ++m) rms(x.data_ptr<float>() + m * h, w.data_ptr<float>(), y.data_ptr<float>() + m * h, h,
                                      static_cast<float>(eps));
  return y;
}

}  // namespace

// x [N, H] -> the layer's output [N, H]. qkv/gate_up are the fused products; kbuf/vbuf the cache's buffers
// [1, Hk, cap, D] with room for past + N rows (rows past.. are written here); cos/sin [N, D] with rotate_half's
// sign folded into sin; blocked bool [N, past + N] (True = may not attend), or none: every key; attn_in, when
// given, is what the q/k/v product reads instead of RMSNorm(x) (ln1 is then unused).
torch::Tensor lean_layer(torch::Tensor x, torch::Tensor ln1, double eps1, torch::Tensor wqkv,
                         c10::optional<torch::Tensor> bqkv, c10::optional<torch::Tensor> q_norm,
                         c10::optional<torch::Tensor> k_norm, double eps_qk, torch::Tensor wo,
                         c10::optional<torch::Tensor> bo, torch::Tensor ln2, double eps2, torch::Tensor wgu,
                         c10::optional<torch::Tensor> bgu, torch::Tensor wd, c10::optional<torch::Tensor> bd, torch::Tensor kbuf, torch::Tensor vbuf,
                         int64_t past, torch::Tensor cos, torch::Tensor sin, c10::optional<torch::Tensor> blocked,
                         int64_t hq, int64_t hk, int64_t D, double scale, c10::optional<torch::Tensor> attn_in) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x [N, H] fp32 expected");
  TORCH_CHECK(kbuf.is_contiguous() && vbuf.is_contiguous() && kbuf.size(1) == hk && kbuf.size(3) == D,
              "cache buffers [1, Hk, cap, D] expected");
  const int64_t N = x.size(0), T = past + N, cap = kbuf.size(2), W = (hq + 2 * hk) * D, half = D / 2;
  TORCH_CHECK(T <= cap, "cache buffers too small");
  TORCH_CHECK(cos.size(0) == N && cos.size(1) == D && sin.size(0) == N && sin.size(1) == D, "cos/sin [N, D] expected");
  const uint8_t* blk = nullptr;
  if (blocked.has_value() && blocked->defined()) {
    TORCH_CHECK(blocked->is_contiguous() && blocked->size(0) == N && blocked->size(1) == T, "blocked [N, P+N] expected");
    blk = reinterpret_cast<const uint8_t*>(blocked->data_ptr<bool>());
  }
  // an EAGLE-3 drafter's first layer reads [norm(embed), norm(hidden)] (2H) while its residual is x
  const bool own_in = attn_in.has_value() && attn_in->defined();
  TORCH_CHECK(!own_in || (attn_in->dim() == 2 && attn_in->is_contiguous() && attn_in->size(0) == x.size(0)),
              "attn_in [N, K] contiguous expected");
  auto qkv = ::linear(own_in ? *attn_in : rows_rms(x, ln1, eps1), wqkv, bqkv);  // [N, (Hq + 2 Hk) D]
  float* p = qkv.data_ptr<float>();
  float* kb = kbuf.data_ptr<float>();
  float* vb = vbuf.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  std::vector<float> tmp(D);
  for (int64_t m = 0; m < N; ++m) {
    for (int64_t h = 0; h < hq + hk; ++h) {  // q and k heads: per-head norm (Qwen3), then rotary
      float* v = p + m * W + h * D;
      const auto& nw = h < hq ? q_norm : k_norm;
      if (nw.has_value() && nw->defined()) rms(v, nw->data_ptr<float>(), v, D, static_cast<float>(eps_qk));
      for (int64_t i = 0; i < D; ++i) tmp[i] = v[i] * cs[m * D + i] + v[(i + half) % D] * sn[m * D + i];
      std::copy(tmp.begin(), tmp.end(), v);
    }
    for (int64_t g = 0; g < hk; ++g) {
      std::copy_n(p + m * W + (hq + g) * D, D, kb + (g * cap + past + m) * D);
      std::copy_n(p + m * W + (hq + hk + g) * D, D, vb + (g * cap + past + m) * D);
    }
  }
  auto attn = torch::zeros({N, hq * D}, x.options());
  float* out = attn.data_ptr<float>();
  const int64_t group = hq / hk;
  at::parallel_for(0, hq * N, 1, [&](int64_t a, int64_t b) {
    std::vector<float> s(T);
    for (int64_t idx = a; idx < b; ++idx) {
      const int64_t h = idx / N, m = idx % N, g = h / group;
      const float* q = p + m * W + h * D;
      const float* K = kb + g * cap * D;
      const float* V = vb + g * cap * D;
      const float ninf = -std::numeric_limits<float>::infinity(), sc = static_cast<float>(scale);
      int64_t j = 0;
      if (D % 8 == 0)
        for (; j + 8 <= T; j += 8) _mm256_storeu_ps(&s[j], _mm256_mul_ps(dot8(q, K + j * D, D), _mm256_set1_ps(sc)));
      for (; j < T; ++j) s[j] = dot(q, K + j * D, D) * sc;
      if (blk)
        for (j = 0; j < T; ++j)
          if (blk[m * T + j]) s[j] = ninf;
      __m256 mv = _mm256_set1_ps(ninf);
      for (j = 0; j + 8 <= T; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(&s[j]));
      float mx = hmax8(mv);
      for (; j < T; ++j) mx = std::max(mx, s[j]);
      const __m256 inv = _mm256_set1_ps(1.f / exp_shifted(s.data(), T, mx));
      for (j = 0; j + 8 <= T; j += 8) _mm256_storeu_ps(&s[j], _mm256_mul_ps(_mm256_loadu_ps(&s[j]), inv));
      for (; j < T; ++j) s[j] *= _mm256_cvtss_f32(inv);  // blocked keys stay 0 and are skipped
      weighted_rows(s.data(), V, T, D, out + m * hq * D + h * D);
    }
  });
  auto x1 = x + ::linear(attn, wo, bo);  // [N, H]
  auto gu = ::linear(rows_rms(x1, ln2, eps2), wgu, bgu);  // [N, 2I]
  const int64_t I = gu.size(1) / 2;
  auto act = torch::empty({N, I}, x.options());
  const float* g = gu.data_ptr<float>();
  float* a = act.data_ptr<float>();
  for (int64_t m = 0; m < N; ++m) silu_mul(g + m * 2 * I, g + m * 2 * I + I, a + m * I, I);
  return x1.add_(::linear(act, wd, bd));
}

// Rows past + src[i] -> past + i of every [B, H, cap, D] buffer, for i >= first (src ascending, src[i] >= i, so
// no row is read after it was overwritten). Why: a tree verify keeps the root and the accepted path; in
// Python that was two index_selects and two slice writes per layer (~0.16 ms a round on the default target).
void move_rows(std::vector<torch::Tensor> bufs, int64_t past, std::vector<int64_t> src, int64_t first) {
  for (auto& b : bufs) {
    TORCH_CHECK(b.dim() == 4 && b.is_contiguous() && b.device().is_cpu(), "contiguous CPU [B, H, cap, D] buffers expected");
    const int64_t cap = b.size(2), planes = b.size(0) * b.size(1), row = b.size(3) * b.element_size();
    TORCH_CHECK(past + static_cast<int64_t>(src.size()) <= cap && (src.empty() || past + src.back() < cap),
                "rows out of the buffer");
    auto* base = static_cast<char*>(b.data_ptr());
    for (int64_t p = 0; p < planes; ++p) {
      char* plane = base + p * cap * row;
      for (int64_t i = first; i < static_cast<int64_t>(src.size()); ++i)
        if (src[i] != i) std::memmove(plane + (past + i) * row, plane + (past + src[i]) * row, row);
    }
  }
}
