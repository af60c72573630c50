// y[M, N] = x[M, K] @ W[N, K]^T (+ b) for M = 1..16 rows, fp32 (W fp32, bf16 or int8 rows with a scale),
// AVX2/FMA (AVX-512 for 7+ rows where the CPU has it).
//
// Why: a speculative verify multiplies 2..16 rows by every weight of the target.
// MKL and oneDNN run such thin products on one core (or re-read W per row), so a
// 4-token verify cost 1.6x a decode step on 2 cores. Here W is streamed from
// memory once for all M rows, and its output rows are split across torch's
// intra-op threads (at::parallel_for), as the M = 1 path already is.
// Built once per torch version and CPU capability by eaglewire/targets/smallm.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static inline float load1(const float* p) { return *p; }
static inline float load1(const uint16_t* p) {
  const uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
static inline float load1(const int8_t* p) { return static_cast<float>(*p); }

// An int8 matrix is stored as rows of K int8 values each followed by that row's fp32 scale (4 bytes), so a
// drafter's matrix streams a quarter of its fp32 bytes and still travels as one tensor [N, K + 4] through
// every call (smallm.py's quantize_rows writes it). fp32 and bf16 rows carry no scale.
template <typename W>
constexpr int64_t SCALE_BYTES = std::is_same<W, int8_t>::value ? 4 : 0;
static inline float row_scale(const float*, int64_t) { return 1.f; }
static inline float row_scale(const uint16_t*, int64_t) { return 1.f; }
static inline float row_scale(const int8_t* row, int64_t K) {
  float s;
  std::memcpy(&s, row + K, sizeof s);
  return s;
}

// The vector width the products run at. A weight row's L floats: fp32 as stored, or bf16 (the top half of an
// fp32) widened by a 16-bit shift, so a bf16 matrix streams half the bytes and every product sums in fp32.
struct Avx2 {
  using V = __m256;
  static constexpr int64_t L = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V load(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) { return hsum(v); }
};

#if defined(__AVX512F__)
struct Avx512 {
  using V = __m512;
  static constexpr int64_t L = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V load(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};
#endif

// R weight rows per pass (R*M accumulators must fit the registers: 16 ymm, 32 zmm); PF: prefetch the next rows.
template <class S, int M, int R, bool PF, typename W>
static void block(const float* x, const W* w, const float* b, float* y, int64_t n, int64_t N, int64_t K) {
  const int64_t KL = K & ~(S::L - 1), ld = K + SCALE_BYTES<W>;  // ld: a weight row's stride
  const bool pf = PF && n + 2 * R <= N;  // the next R rows exist
  constexpr int64_t LINE = 64 / sizeof(W);  // weights per cache line: one prefetch each
  typename S::V acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = S::zero();
  for (int64_t k = 0; k < KL; k += S::L) {
    typename S::V wv[R];
    for (int r = 0; r < R; ++r) wv[r] = S::load(w + (n + r) * ld + k);
    if (pf && (k & (LINE - 1)) == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + (n + R + r) * ld + k), _MM_HINT_T0);
    for (int m = 0; m < M; ++m) {
      const typename S::V xv = S::load(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] = S::fma(wv[r], xv, acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const W* wr = w + (n + r) * ld;
    const float scale = row_scale(wr, K);
    for (int m = 0; m < M; ++m) {
      float s = S::sum(acc[r][m]);
      for (int64_t k = KL; k < K; ++k) s += load1(wr + k) * x[m * K + k];
      y[m * N + n + r] = s * scale + (b ? b[n + r] : 0.f);
    }
  }
}

// Measured on a 2-core AVX2 EPYC over a 30-layer stack of SmolLM2-135M's shapes (weights from DRAM): 1 row
// is bound by memory and gains from 4 concurrent row streams; 3..6 rows are bound by the FMA chains and gain
// from software prefetch of the next rows instead (without it 4 rows cost 1.4x one row, with it ~1.25x).
// 2 rows (a verify of one draft, a drafter extend by one accepted token) took 4 streams too until a 2-core
// Intel VM measured them at 1.24x one row that way and 1.0x with 2 rows and prefetch (the same stack).
template <int M, typename W>
static void rows(const float* x, const W* w, const float* b, float* y, int64_t n0, int64_t n1, int64_t N,
                 int64_t K) {
  constexpr int R = M == 1 ? 4 : (M <= 6 ? 2 : 1);
  constexpr bool PF = M > 1;
  int64_t n = n0;
  for (; n + R <= n1; n += R) block<Avx2, M, R, PF>(x, w, b, y, n, N, K);
  for (; n < n1; ++n) block<Avx2, M, 1, false>(x, w, b, y, n, N, K);
}

// 7..16 rows: x rows 4 at a time over the same 3 weight rows (12 accumulators, 3 weight vectors and one x
// vector in the 16 ymm registers), so each weight vector loaded serves 4 FMAs and each x vector 3, where one
// weight row over 8 x rows loaded 9 vectors per 8 FMAs. The 3 weight rows stay in L1 between the groups and
// still cross the memory bus once. Measured on the 2-core AMD VM over the default target's stack (lean
// forward + logits, interleaved, 12 rounds): 8 rows 27.2 -> 23.8 ms, 12 rows 38.5 -> 31.7, 16 rows
// 47.7 -> 39.4 (one row: 19-20 ms); 1..6 rows keep the paths above.
template <class S, int R, typename W>
static void groups(int64_t M, const float* x, const W* w, const float* b, float* y, int64_t n, int64_t N,
                   int64_t K) {
  for (int64_t m = 0; m < M; m += 4) {
    const float* xg = x + m * K;
    float* yg = y + m * N;
    switch (std::min<int64_t>(4, M - m)) {
      case 1: block<S, 1, R, true>(xg, w, b, yg, n, N, K); break;
      case 2: block<S, 2, R, true>(xg, w, b, yg, n, N, K); break;
      case 3: block<S, 3, R, true>(xg, w, b, yg, n, N, K); break;
      default: block<S, 4, R, true>(xg, w, b, yg, n, N, K); break;
    }
  }
}

// Where the kernel was built for an AVX-512 CPU (smallm.py passes the flags when torch reports that
// capability): the same grouping over 4 weight rows of 512-bit vectors (16 accumulators of the 32 zmm
// registers, 16 floats per FMA). Why: from 7 rows on the AVX2 groups are bound by the FMAs, not by memory.
// Measured on a 2-core AMD EPYC (Zen 5) over the default target's stack of products, interleaved: 8 rows
// 12.49 -> 11.33 ms, 12 rows 16.32 -> 13.43 (one row 10.7-10.8); 3..6 rows gained nothing and keep AVX2.
#if defined(__AVX512F__)
using Wide = Avx512;
constexpr int WIDE_R = 4;
#else
using Wide = Avx2;
constexpr int WIDE_R = 3;
#endif

template <typename W>
static void grouped_rows(int64_t M, const float* x, const W* w, const float* b, float* y, int64_t n0, int64_t n1,
                         int64_t N, int64_t K) {
  int64_t n = n0;
  for (; n + WIDE_R <= n1; n += WIDE_R) groups<Wide, WIDE_R>(M, x, w, b, y, n, N, K);
  for (; n < n1; ++n) groups<Wide, 1>(M, x, w, b, y, n, N, K);
}

template <typename W>
static void run_rows(int64_t M, const float* x, const W* w, const float* b, float* y, int64_t n0, int64_t n1,
                     int64_t N, int64_t K) {
  if (M >= 7) {
    grouped_rows(M, x, w, b, y, n0, n1, N, K);
    return;
  }
  switch (M) {
    case 1: rows<1>(x, w, b, y, n0, n1, N, K); break;
    case 2: rows<2>(x, w, b, y, n0, n1, N, K); break;
    case 3: rows<3>(x, w, b, y, n0, n1, N, K); break;
    case 4: rows<4>(x, w, b, y, n0, n1, N, K); break;
    case 5: rows<5>(x, w, b, y, n0, n1, N, K); break;
    default: rows<6>(x, w, b, y, n0, n1, N, K); break;
  }
}

constexpr int64_t MAX_ROWS = 16;

template <typename W>
static void products(const float* xp, const W* wp, const float* bp, float* yp, int64_t M, int64_t N, int64_t K) {
  // grain: at least 32 output rows per task (a task streams >= 32*K weights)
  at::parallel_for(0, N, 32, [&](int64_t n0, int64_t n1) { run_rows(M, xp, wp, bp, yp, n0, n1, N, K); });
}

// w fp32, bf16 or int8 rows with their scale (a drafter's matrices at a half or a quarter of the bytes; x, bias
// and y stay fp32)
torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  const bool half = w.scalar_type() == at::kBFloat16, q8 = w.scalar_type() == at::kChar;
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) - (q8 ? SCALE_BYTES<int8_t> : 0),
              "x [M, K] and w [N, K] (int8: [N, K + 4]) expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat && (half || q8 || w.scalar_type() == at::kFloat),
              "fp32 x, fp32, bf16 or int8 w only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "contiguous x and w expected");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= MAX_ROWS, "1..16 rows only");
  auto y = torch::empty({M, N}, x.options());
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N && bias->is_contiguous(), "bias [N] expected");
    bp = bias->data_ptr<float>();
  }
  if (half)
    products(x.data_ptr<float>(), reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), bp,
             y.data_ptr<float>(), M, N, K);
  else if (q8)
    products(x.data_ptr<float>(), w.data_ptr<int8_t>(), bp, y.data_ptr<float>(), M, N, K);
  else
    products(x.data_ptr<float>(), w.data_ptr<float>(), bp, y.data_ptr<float>(), M, N, K);
  return y;
}

// lean_layer.cpp: one decoder layer around these products
torch::Tensor lean_layer(torch::Tensor x, torch::Tensor ln1, double eps1, torch::Tensor wqkv,
                         c10::optional<torch::Tensor> bqkv, c10::optional<torch::Tensor> q_norm,
                         c10::optional<torch::Tensor> k_norm, double eps_qk, torch::Tensor wo,
                         c10::optional<torch::Tensor> bo, torch::Tensor ln2, double eps2, torch::Tensor wgu,
                         c10::optional<torch::Tensor> bgu, torch::Tensor wd, c10::optional<torch::Tensor> bd,
                         torch::Tensor kbuf, torch::Tensor vbuf, int64_t past, torch::Tensor cos, torch::Tensor sin,
                         c10::optional<torch::Tensor> blocked, int64_t hq, int64_t hk, int64_t D, double scale,
                         c10::optional<torch::Tensor> attn_in);

void move_rows(std::vector<torch::Tensor> bufs, int64_t past, std::vector<int64_t> src, int64_t first);  // lean_layer.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("move_rows", &move_rows, "keep chosen rows of KV buffers in place (lean_layer.cpp)");
  m.def("linear", &linear, "y = x W^T (+ b), 1..16 rows, fp32 x, fp32, bf16 or int8 (+ row scale) W, AVX2");
  m.def("lean_layer", &lean_layer, "one Llama-family decoder layer for 1..16 tokens (lean_layer.cpp)");
}
