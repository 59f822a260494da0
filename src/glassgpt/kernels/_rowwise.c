/* The position-wise maps of a GPT block, float32, by glassgpt's own loops:
 *
 *   layer norm   y = (x − μ) · s ⊙ w + b,   μ = mean(x),  s = 1/√(mean((x − μ)²) + ε)
 *   RMS norm     y = x · s ⊙ w,             s = 1/√(mean(x²) + ε)
 *   tanh GELU    y = ½ x (1 + tanh(u)) = x σ(2u),   u = √(2/π) (x + 0.044715 x³)
 *   its slope    dy/dx = s + x s (1 − s) c₀ (1 + 3 c₁ x²),   s = σ(2u), c₀ = 2√(2/π), c₁ = 0.044715
 *   exact GELU   y = x Φ(x),  Φ(x) = ½ (1 + erf(x/√2));  slope Φ(x) + x φ(x), φ the normal density
 *
 * A decoding step's few rows (and its writes to a KV cache), on one thread: PyTorch's
 * kernels spend most of a call on set-up when the input is one row of 768 values (10-17 µs
 * in a decoding step against about 1 µs of arithmetic); these do the arithmetic alone. The
 * norms take two passes (the mean, then the squares of x − μ); the GELU with AVX2 + FMA
 * computes x / (1 + exp(−2u)) with exp8 (_vexp.h; a few float32 ulps from PyTorch's tanh
 * form), the portable loop the tanh form itself.
 *
 * A training step's GELU and its gradient over whole activations (gelu_many), in parts on
 * PyTorch's threads (_parallel.h): one pass each, where PyTorch's tanh GELU takes a slow
 * vectorised tanh and its σ form four passes ([12, 64, 512], 2 threads: forward 127 µs
 * against 476 for the σ form, forward and backward 307 against 1,131).
 *
 * Python API (addresses of contiguous float32 buffers as ints; the caller checks shapes,
 * dtypes and devices; the GIL is held through the short calls, released by gelu_many):
 *   norm(x, w, b or 0, y, rows, d, eps, centred)   centred: layer norm (1) or RMS norm (0)
 *   gelu_many(x, g or 0, y, n, threads, exact)   the GELU, tanh or exact (erf), or its
 *                              gradient (g ≠ 0), over n values, in parts (a decoding step's
 *                              few rows: threads = 1), the GIL released
 *   gelu_slope(x, y, d, n, threads)   the tanh GELU y (gelu_many's bits) and its slope d in
 *                              one pass, in parts: a training step's forward keeps d, and its
 *                              backward is one product g · d instead of the exps again
 *   kv_write(K, V, k, v, B, H, T, D, n, strides)   a KV cache's step: K[:, :, n:n+T] = k, V…
 *   add(a, b, y, n)   y = a + b over n values (a replayed step's residual sums)
 *   embed(W_E, tokens, P or 0, y, B, d, n_vocab, pos, positions or 0)   y[b] = W_E[tokens[b]]
 *                              + P[pos] (+ P[positions[b]] where int64 positions are given),
 *                              the step's first residual (tokens int64; ValueError out of range)
 *   kv_write_rows(K, V, k, v, B, H, D, lengths, strides)   K[b, :, n_b] = k[b, :, 0] and the
 *                              same for V, n_b = lengths[b] (int64, read when it runs)
 *   advance(lengths, B, T)     lengths[b] += T for b < B (int64)
 *   sum_squares(addresses, lengths, threads) → Σ x² over float32 buffers (a tuple of each),
 *                              in float64, chunk by chunk in a fixed order, in parts, the
 *                              GIL released (gradient clipping's ‖g‖₂², one call for all)
 *   scale_many(addresses, lengths, factor, threads)   x ← factor · x in each buffer, likewise
 *   norm_train(x, w, b or 0, y, stats, rows, d, eps, centred, threads)   norm() of each row,
 *                              keeping μ (0 when not centred) and s = 1/√(σ² + ε) per row in
 *                              stats [rows, 2] for the backward, rows in parts
 *   norm_train_backward(x, w, stats, g, dx, dw or 0, db or 0, rows, d, centred, threads)
 *                              dx, and dw = Σ g ⊙ x̂, db = Σ g over the rows, summed
 *                              in blocks of NORM_BLOCK rows and then block by block: the same
 *                              for any thread count
 *   transpose(x, y, rows, cols, threads)   y[c, r] = x[r, c] for contiguous float32 x [rows,
 *                              cols] and y [cols, rows], in 8 × 8 blocks, in parts, the GIL
 *                              released (the first operand of oneDNN's ∂W = xᵀ g)
 *   argmax_rows(z, B, V, stride) → [the first index of the largest of the first V values of
 *                              each of B float32 rows, stride apart] (greedy decoding), or
 *                              None where a row holds a NaN or an infinite largest value
 *   kernel() → "avx2" or "portable";  use_portable(flag) → the kernel now in use (tests)
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu.h"
#include "_parallel.h"

/* y = (x − μ) s w + b for one row of d values; stats (NULL: not kept) gets μ and s. */
typedef void (*NormFn)(const float *x, const float *w, const float *b, float *y, int d,
                       float eps, int centred, float *stats);
typedef void (*GeluFn)(const float *x, float *y, Py_ssize_t n);
typedef void (*GeluBackFn)(const float *x, const float *g, float *dx, Py_ssize_t n);
typedef void (*GeluSlopeFn)(const float *x, float *y, float *d, Py_ssize_t n);

#define GELU_C0 0.7978845608028654f /* √(2/π) */
#define GELU_C1 0.044715f
#define SQRT_HALF 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/* ------------------------------------------------------------------- portable loops -- */

/* The first index of z's largest value over n > 0 values; *finite = 0 where a value is NaN
 * or the largest is ±inf (the caller then takes PyTorch's path, which handles those). */
static long long argmax_portable(const float *z, long long n, int *finite) {
    long long k = 0;
    float m = z[0];
    int nan = 0;
    for (long long i = 0; i < n; i++) {
        nan |= z[i] != z[i];
        if (z[i] > m)
            m = z[i], k = i;
    }
    *finite = !nan && isfinite(m);
    return k;
}

static void norm_portable(const float *x, const float *w, const float *b, float *y, int d,
                          float eps, int centred, float *stats) {
    double sum = 0.0, squares = 0.0;
    for (int i = 0; i < d; i++)
        sum += x[i];
    const float mu = centred ? (float)(sum / d) : 0.0f;
    for (int i = 0; i < d; i++) {
        const double c = (double)x[i] - mu;
        squares += c * c;
    }
    const float s = (float)(1.0 / sqrt(squares / d + eps));
    for (int i = 0; i < d; i++)
        y[i] = (x[i] - mu) * s * w[i] + (b ? b[i] : 0.0f);
    if (stats)
        stats[0] = mu, stats[1] = s;
}

static void gelu_portable(const float *x, float *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float u = GELU_C0 * (x[i] + GELU_C1 * x[i] * x[i] * x[i]);
        y[i] = 0.5f * x[i] * (1.0f + tanhf(u));
    }
}

/* The tanh GELU's slope s + v s (1 − s) c₀ (1 + 3 c₁ v²), s = σ(c₀ (v + c₁ v³)), c₀ = 2√(2/π):
 * the derivative of v s, which is the tanh GELU (½ (1 + tanh u) = σ(2u)). */
static inline float gelu_slope1(float v) {
    const float c0 = 2.0f * GELU_C0, s = 1.0f / (1.0f + expf(-c0 * (v + GELU_C1 * v * v * v)));
    return s + v * s * (1.0f - s) * c0 * (1.0f + 3.0f * GELU_C1 * v * v);
}

/* dx = g · GELU'(x). */
static void gelu_backward_portable(const float *x, const float *g, float *dx, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        dx[i] = g[i] * gelu_slope1(x[i]);
}

/* The tanh GELU y, as gelu_portable computes it (the same bits), and its slope d, in one
 * pass: for a training step's forward to keep d, so that its backward is g · d. */
static void gelu_slope_portable(const float *x, float *y, float *d, Py_ssize_t n) {
    gelu_portable(x, y, n);
    for (Py_ssize_t i = 0; i < n; i++)
        d[i] = gelu_slope1(x[i]);
}

/* The exact GELU, y = x Φ(x) with Φ(x) = ½ (1 + erf(x/√2)), and its slope Φ(x) + x φ(x),
 * φ(x) = exp(−x²/2)/√(2π). */
static void gelu_erf_portable(const float *x, float *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT_HALF));
}

static void gelu_erf_backward_portable(const float *x, const float *g, float *dx, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = x[i], cdf = 0.5f * (1.0f + erff(v * SQRT_HALF));
        dx[i] = g[i] * (cdf + v * expf(-0.5f * v * v) * INV_SQRT_2PI);
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA kernels -- */
#if GG_X86
#include "_vexp.h"

AVX2 static float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Σ_i (x_i − c)² (squares) or Σ_i x_i, in 32 lanes, then the tail one by one. */
AVX2 static float row_sum(const float *x, int d, float c, int squares) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const __m256 cv = _mm256_set1_ps(c);
    int i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256 v0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), cv);
        __m256 v1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), cv);
        __m256 v2 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 16), cv);
        __m256 v3 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 24), cv);
        if (squares) {
            a0 = _mm256_fmadd_ps(v0, v0, a0), a1 = _mm256_fmadd_ps(v1, v1, a1);
            a2 = _mm256_fmadd_ps(v2, v2, a2), a3 = _mm256_fmadd_ps(v3, v3, a3);
        } else {
            a0 = _mm256_add_ps(v0, a0), a1 = _mm256_add_ps(v1, a1);
            a2 = _mm256_add_ps(v2, a2), a3 = _mm256_add_ps(v3, a3);
        }
    }
    for (; i + 8 <= d; i += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), cv);
        a0 = squares ? _mm256_fmadd_ps(v, v, a0) : _mm256_add_ps(v, a0);
    }
    float total = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < d; i++)
        total += squares ? (x[i] - c) * (x[i] - c) : x[i] - c;
    return total;
}

AVX2 static void norm_avx2(const float *x, const float *w, const float *b, float *y, int d,
                           float eps, int centred, float *stats) {
    const float mu = centred ? row_sum(x, d, 0.0f, 0) / d : 0.0f;
    const float s = 1.0f / sqrtf(row_sum(x, d, mu, 1) / d + eps);
    const __m256 muv = _mm256_set1_ps(mu), sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), muv), sv);
        __m256 bias = b ? _mm256_loadu_ps(b + i) : _mm256_setzero_ps();
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(v, _mm256_loadu_ps(w + i), bias));
    }
    for (; i < d; i++)
        y[i] = (x[i] - mu) * s * w[i] + (b ? b[i] : 0.0f);
    if (stats)
        stats[0] = mu, stats[1] = s;
}

AVX2 static void gelu_avx2(const float *x, float *y, Py_ssize_t n) {
    const __m256 c0 = _mm256_set1_ps(-2.0f * GELU_C0);  /* −2u = x (c0 + c1 x²) */
    const __m256 c1 = _mm256_set1_ps(-2.0f * GELU_C0 * GELU_C1);
    const __m256 one = _mm256_set1_ps(1.0f);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 t = _mm256_mul_ps(v, _mm256_fmadd_ps(c1, _mm256_mul_ps(v, v), c0));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, exp8(t))));
    }
    gelu_portable(x + i, y + i, n - i);
}

/* The tanh GELU's slope d = s + x s (1 − s) c₀ (1 + 3 c₁ x²) for 8 lanes v, and the
 * denominator 1 + exp(−2u) (s = 1 / den), which gelu_avx2 divides x by. */
AVX2 static inline __m256 gelu_slope8(__m256 v, __m256 *den) {
    const __m256 nc0 = _mm256_set1_ps(-2.0f * GELU_C0), nc1 = _mm256_set1_ps(-2.0f * GELU_C0 * GELU_C1);
    const __m256 c0 = _mm256_set1_ps(2.0f * GELU_C0), c3 = _mm256_set1_ps(3.0f * GELU_C1);
    const __m256 one = _mm256_set1_ps(1.0f), v2 = _mm256_mul_ps(v, v);
    *den = _mm256_add_ps(one, exp8(_mm256_mul_ps(v, _mm256_fmadd_ps(nc1, v2, nc0))));
    __m256 s = _mm256_div_ps(one, *den);
    __m256 slope = _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_sub_ps(one, s)); /* x s (1 − s) */
    slope = _mm256_mul_ps(slope, _mm256_mul_ps(c0, _mm256_fmadd_ps(c3, v2, one)));
    return _mm256_add_ps(s, slope);
}

AVX2 static void gelu_backward_avx2(const float *x, const float *g, float *dx, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 den, d = gelu_slope8(_mm256_loadu_ps(x + i), &den);
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), d));
    }
    gelu_backward_portable(x + i, g + i, dx + i, n - i);
}

/* gelu_slope_portable with exp8: y as gelu_avx2 gives it, bit for bit, and its slope. */
AVX2 static void gelu_slope_avx2(const float *x, float *y, float *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), den;
        _mm256_storeu_ps(d + i, gelu_slope8(v, &den));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, den));
    }
    gelu_slope_portable(x + i, y + i, d + i, n - i);
}

/* Φ(x) and exp(−x²/2) for 8 lanes: erfc(z) = t (a₁ + t (a₂ + t (a₃ + t (a₄ + t a₅)))) e^{−z²},
 * t = 1/(1 + p z), z = |x|/√2 (Abramowitz and Stegun 7.1.26: |error| < 1.5e-7), and
 * Φ(x) = 1 − ½ erfc(z) for x ≥ 0, ½ erfc(z) below: no cancellation in the left tail. */
AVX2 static inline __m256 normal_cdf8(__m256 v, __m256 *gauss) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(SQRT_HALF));
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), z, one));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    *gauss = exp8(_mm256_mul_ps(_mm256_set1_ps(-1.0f), _mm256_mul_ps(z, z))); /* e^{−x²/2} */
    __m256 tail = _mm256_mul_ps(half, _mm256_mul_ps(_mm256_mul_ps(p, t), *gauss)); /* ½ erfc(z) */
    __m256 right = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ);
    return _mm256_blendv_ps(tail, _mm256_sub_ps(one, tail), right);
}

AVX2 static void gelu_erf_avx2(const float *x, float *y, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), gauss;
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v, normal_cdf8(v, &gauss)));
    }
    gelu_erf_portable(x + i, y + i, n - i);
}

AVX2 static void gelu_erf_backward_avx2(const float *x, const float *g, float *dx, Py_ssize_t n) {
    const __m256 c = _mm256_set1_ps(INV_SQRT_2PI);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), gauss;
        __m256 cdf = normal_cdf8(v, &gauss);
        __m256 slope = _mm256_fmadd_ps(_mm256_mul_ps(v, c), gauss, cdf); /* Φ + x φ */
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), slope));
    }
    gelu_erf_backward_portable(x + i, g + i, dx + i, n - i);
}
#endif

/* Σ x² over n float32 values, accumulated in float64 (a gradient's share of ‖g‖₂²). */
typedef double (*SumSqFn)(const float *x, Py_ssize_t n);

static double sum_sq_portable(const float *x, Py_ssize_t n) {
    double acc[4] = {0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++)
            acc[l] += (double)x[i + l] * x[i + l];
    for (; i < n; i++)
        acc[0] += (double)x[i] * x[i];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

#if GG_X86
AVX2 static double sum_sq_avx2(const float *x, Py_ssize_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
        __m256d u0 = _mm256_cvtps_pd(_mm256_castps256_ps128(u));
        __m256d u1 = _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1));
        __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(w));
        __m256d w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1));
        a0 = _mm256_fmadd_pd(u0, u0, a0), a1 = _mm256_fmadd_pd(u1, u1, a1);
        a2 = _mm256_fmadd_pd(w0, w0, a2), a3 = _mm256_fmadd_pd(w1, w1, a3);
    }
    __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a2), _mm256_add_pd(a1, a3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double total = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    return total + sum_sq_portable(x + i, n - i);
}
#endif

/* A norm's backward over rows [r0, r1) of the job, shared among parts in blocks of
 * NORM_BLOCK rows; each block's Σ g x̂ and Σ g go to its own row of parts_w, parts_b. */
#define NORM_BLOCK 32

typedef struct {
    const float *x, *w, *b, *g;
    float *y, *stats, *dx, *parts_w, *parts_b; /* stats: μ, s per row */
    float *scratch;                            /* the backward's 2 d floats a part */
    long long rows;
    int d, centred;
    float eps;
} NormJob;

typedef void (*NormBackFn)(const NormJob *j, long long r0, long long r1, float *pw, float *pb,
                           float *scratch);

/* Σ u[i] v[i] (v NULL: Σ u[i]) over n values in 8 lanes, then lane by lane. */
static float lanes_dot(const float *u, const float *v, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += u[i + l] * (v ? v[i + l] : 1.0f);
    for (; i < n; i++)
        acc[0] += u[i] * (v ? v[i] : 1.0f);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Rows [r0, r1) of the backward: x̂ = (x − μ) s, ĝ = g ⊙ w,
 * dx = s (ĝ − mean(ĝ) − x̂ mean(ĝ x̂))  (mean(ĝ) left out when not centred),
 * and this block's Σ g x̂ and Σ g added to pw, pb (zeroed by the caller; pb NULL: no bias).
 * scratch: 2 d floats. */
static void norm_back_portable(const NormJob *j, long long r0, long long r1, float *pw,
                               float *pb, float *scratch) {
    const int d = j->d;
    float *xh = scratch, *gh = scratch + d;
    for (long long r = r0; r < r1; r++) {
        const float *x = j->x + r * d, *g = j->g + r * d;
        float *dx = j->dx + r * d;
        const float mu = j->stats[2 * r], s = j->stats[2 * r + 1];
        for (int i = 0; i < d; i++)
            xh[i] = (x[i] - mu) * s, gh[i] = g[i] * j->w[i];
        const float a = j->centred ? lanes_dot(gh, NULL, d) / (float)d : 0.0f;
        const float c = lanes_dot(gh, xh, d) / (float)d;
        for (int i = 0; i < d; i++)
            dx[i] = s * (gh[i] - a - xh[i] * c);
        for (int i = 0; i < d; i++)
            pw[i] += g[i] * xh[i];
        if (pb)
            for (int i = 0; i < d; i++)
                pb[i] += g[i];
    }
}

/* y [cols, rows] = xᵀ for x [rows, cols]: the columns [c0, c1) of x go to rows c0… of y. */
typedef struct {
    const float *x;
    float *y;
    long long rows, cols;
} Transpose;

typedef void (*TransposeFn)(const Transpose *t, long long c0, long long c1);
typedef long long (*ArgmaxFn)(const float *z, long long n, int *finite);

/* y[c, r] = x[r, c] for r in [r0, r1), c in [c0, c1), one value at a time. */
static void transpose_values(const Transpose *t, long long r0, long long r1, long long c0,
                             long long c1) {
    for (long long r = r0; r < r1; r++)
        for (long long c = c0; c < c1; c++)
            t->y[c * t->rows + r] = t->x[r * t->cols + c];
}

static void transpose_portable(const Transpose *t, long long c0, long long c1) {
    transpose_values(t, 0, t->rows, c0, c1);
}

#if GG_X86
/* The backward's rows with 8-wide vectors; d not a multiple of 8: the portable loops. */
AVX2 static void norm_back_avx2(const NormJob *j, long long r0, long long r1, float *pw,
                                float *pb, float *scratch) {
    const int d = j->d;
    if (d % 8) {
        norm_back_portable(j, r0, r1, pw, pb, scratch);
        return;
    }
    const float inv_d = 1.0f / (float)d;
    for (long long r = r0; r < r1; r++) {
        const float *x = j->x + r * d, *g = j->g + r * d;
        float *dx = j->dx + r * d;
        const __m256 m = _mm256_set1_ps(j->stats[2 * r]), sv = _mm256_set1_ps(j->stats[2 * r + 1]);
        __m256 sum_gh[4], sum_ghx[4]; /* four chains each, so that the adds overlap */
        for (int k = 0; k < 4; k++)
            sum_gh[k] = sum_ghx[k] = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) {
            const int k = (i >> 3) & 3;
            const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), sv);
            const __m256 gi = _mm256_loadu_ps(g + i);
            const __m256 gh = _mm256_mul_ps(gi, _mm256_loadu_ps(j->w + i));
            sum_gh[k] = _mm256_add_ps(sum_gh[k], gh);
            sum_ghx[k] = _mm256_fmadd_ps(gh, xh, sum_ghx[k]);
            _mm256_storeu_ps(pw + i, _mm256_fmadd_ps(gi, xh, _mm256_loadu_ps(pw + i)));
            if (pb)
                _mm256_storeu_ps(pb + i, _mm256_add_ps(gi, _mm256_loadu_ps(pb + i)));
        }
        const __m256 t_gh = _mm256_add_ps(_mm256_add_ps(sum_gh[0], sum_gh[1]),
                                          _mm256_add_ps(sum_gh[2], sum_gh[3]));
        const __m256 t_ghx = _mm256_add_ps(_mm256_add_ps(sum_ghx[0], sum_ghx[1]),
                                           _mm256_add_ps(sum_ghx[2], sum_ghx[3]));
        const __m256 a = _mm256_set1_ps(j->centred ? hsum(t_gh) * inv_d : 0.0f);
        const __m256 c = _mm256_set1_ps(hsum(t_ghx) * inv_d);
        for (int i = 0; i < d; i += 8) { /* dx = s (ĝ − a − x̂ c) */
            const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), sv);
            const __m256 gh = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(j->w + i));
            const __m256 v = _mm256_sub_ps(_mm256_sub_ps(gh, a), _mm256_mul_ps(xh, c));
            _mm256_storeu_ps(dx + i, _mm256_mul_ps(sv, v));
        }
    }
}

/* The 8 × 8 block of x at x into y, in registers. */
AVX2 static inline void transpose8(const float *x, long long ldx, float *y, long long ldy) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_loadu_ps(x + i * ldx);
    for (int i = 0; i < 8; i += 2) { /* pairs of rows interleaved */
        b[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* then pairs of pairs */
        a[i] = _mm256_shuffle_ps(b[i], b[i + 2], 0x44);
        a[i + 1] = _mm256_shuffle_ps(b[i], b[i + 2], 0xEE);
        a[i + 2] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0x44);
        a[i + 3] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) { /* then the 128-bit halves */
        _mm256_storeu_ps(y + i * ldy, _mm256_permute2f128_ps(a[i], a[i + 4], 0x20));
        _mm256_storeu_ps(y + (i + 4) * ldy, _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
    }
}

/* The columns [c0, c1): 8 × 8 blocks where whole, 32 rows at a time so that y's lines are
 * written while still in the cache; the edges one value at a time. */
AVX2 static void transpose_avx2(const Transpose *t, long long c0, long long c1) {
    const long long R8 = t->rows / 8 * 8, c8 = c0 + (c1 - c0) / 8 * 8;
    for (long long r0 = 0; r0 < R8; r0 += 32)
        for (long long c = c0; c < c8; c += 8)
            for (long long r = r0; r < r0 + 32 && r < R8; r += 8)
                transpose8(t->x + r * t->cols + c, t->cols, t->y + c * t->rows + r, t->rows);
    transpose_values(t, R8, t->rows, c0, c8);    /* the last rows of these columns */
    transpose_values(t, 0, t->rows, c8, c1); /* the last columns */
}
#endif

#if GG_X86
/* argmax_portable with 8 lanes, each keeping its first largest value and that value's index
 * (n < 2^31); the lanes' largest value, at the smallest index among the lanes that hold it,
 * is the first largest of z. */
AVX2 static long long argmax_avx2(const float *z, long long n, int *finite) {
    if (n < 16)
        return argmax_portable(z, n, finite);
    __m256 best = _mm256_loadu_ps(z);
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = at;
    __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
    const __m256i eight = _mm256_set1_epi32(8);
    long long i = 8;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(z + i);
        idx = _mm256_add_epi32(idx, eight);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, v, gt);
        at = _mm256_blendv_epi8(at, idx, _mm256_castps_si256(gt));
    }
    float bv[8];
    int bi[8];
    _mm256_storeu_ps(bv, best);
    _mm256_storeu_si256((__m256i *)bi, at);
    float m = bv[0];
    long long k = bi[0];
    for (int l = 1; l < 8; l++)
        if (bv[l] > m || (bv[l] == m && bi[l] < k))
            m = bv[l], k = bi[l];
    int bad = _mm256_movemask_ps(nan) != 0;
    for (; i < n; i++) { /* the last values come after every lane's: ties keep the lanes' */
        bad |= z[i] != z[i];
        if (z[i] > m)
            m = z[i], k = i;
    }
    *finite = !bad && isfinite(m);
    return k;
}
#endif

/* ------------------------------------------------------------------------- Python -- */

static NormFn NORM = norm_portable;
static GeluFn GELU = gelu_portable;
static GeluBackFn GELU_BACK = gelu_backward_portable;
static GeluFn GELU_ERF = gelu_erf_portable;
static GeluBackFn GELU_ERF_BACK = gelu_erf_backward_portable;
static GeluSlopeFn GELU_SLOPE = gelu_slope_portable;
static SumSqFn SUM_SQ = sum_sq_portable;
static NormBackFn NORM_BACK = norm_back_portable;
static TransposeFn TRANSPOSE = transpose_portable;
static ArgmaxFn ARGMAX = argmax_portable;
static const char *KERNEL_NAME = "portable";

static void pick_kernels(int portable) {
    NORM = norm_portable, GELU = gelu_portable, GELU_BACK = gelu_backward_portable;
    GELU_ERF = gelu_erf_portable, GELU_ERF_BACK = gelu_erf_backward_portable;
    GELU_SLOPE = gelu_slope_portable;
    SUM_SQ = sum_sq_portable, NORM_BACK = norm_back_portable, TRANSPOSE = transpose_portable;
    ARGMAX = argmax_portable, KERNEL_NAME = "portable";
#if GG_X86
    if (!portable && cpu_has_avx2()) {
        NORM = norm_avx2, GELU = gelu_avx2, GELU_BACK = gelu_backward_avx2;
        GELU_ERF = gelu_erf_avx2, GELU_ERF_BACK = gelu_erf_backward_avx2, SUM_SQ = sum_sq_avx2;
        NORM_BACK = norm_back_avx2, TRANSPOSE = transpose_avx2, KERNEL_NAME = "avx2";
        GELU_SLOPE = gelu_slope_avx2, ARGMAX = argmax_avx2;
    }
#endif
}

#include "_module.h" /* ints(), use_portable(), kernel_name() */

static PyObject *norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[6];
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "norm(x, w, b, y, rows, d, eps, centred)");
        return NULL;
    }
    if (!ints(args, 6, a))
        return NULL;
    const double eps = PyFloat_AsDouble(args[6]);
    const int centred = PyObject_IsTrue(args[7]);
    if ((eps == -1.0 && PyErr_Occurred()) || centred < 0)
        return NULL;
    if (a[4] < 0 || a[5] < 1 || a[5] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "norm: need rows >= 0, d >= 1; got %lld, %lld", a[4], a[5]);
        return NULL;
    }
    const float *x = (const float *)(uintptr_t)a[0], *w = (const float *)(uintptr_t)a[1];
    const float *b = (const float *)(uintptr_t)a[2];
    float *y = (float *)(uintptr_t)a[3];
    const int d = (int)a[5];
    for (long long r = 0; r < a[4]; r++)
        NORM(x + r * d, w, b, y + r * d, d, (float)eps, centred, NULL);
    Py_RETURN_NONE;
}

/* A training step's GELU: n values (n can be millions), forward or backward, in parts on
 * PyTorch's threads (_parallel.h); each part a contiguous range of whole 8-value groups. */
typedef struct {
    const float *x, *g; /* g: the incoming gradient (backward), NULL forward */
    float *y;
    Py_ssize_t n;
    int exact; /* the exact (erf) GELU, else the tanh one */
    float *d;  /* the tanh GELU's slope, kept with y (forward; NULL: not kept) */
} Elementwise;

#define GELU_PART_MIN 32768 /* values per part at least: a thread's wake-up costs ~10 µs */

static void gelu_part(const void *job, int part, int parts) {
    const Elementwise *e = job;
    const Py_ssize_t groups = (e->n + 7) / 8;
    Py_ssize_t lo = groups * part / parts * 8, hi = groups * (part + 1) / parts * 8;
    hi = hi < e->n ? hi : e->n;
    if (lo >= hi)
        return;
    if (e->d)
        GELU_SLOPE(e->x + lo, e->y + lo, e->d + lo, hi - lo);
    else if (e->g)
        (e->exact ? GELU_ERF_BACK : GELU_BACK)(e->x + lo, e->g + lo, e->y + lo, hi - lo);
    else
        (e->exact ? GELU_ERF : GELU)(e->x + lo, e->y + lo, hi - lo);
}

/* e over its n values in parts of GELU_PART_MIN values at least, on up to `threads` threads,
 * the GIL released. */
static void run_elementwise(const Elementwise *e, long long threads) {
    long long parts = threads < 1 ? 1 : threads;
    if (parts > e->n / GELU_PART_MIN)
        parts = e->n / GELU_PART_MIN > 0 ? e->n / GELU_PART_MIN : 1;
    if (parts > 256)
        parts = 256;
    Py_BEGIN_ALLOW_THREADS
    run_parts(gelu_part, e, (int)parts);
    Py_END_ALLOW_THREADS
}

/* gelu_many(x, g or 0, y, n, threads, exact): y = GELU(x) (g = 0) or y = g · GELU'(x), the
 * exact GELU (exact ≠ 0) or the tanh one. */
static PyObject *gelu_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[6];
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "gelu_many(x, g, y, n, threads, exact)");
        return NULL;
    }
    if (!ints(args, 6, a))
        return NULL;
    if (a[3] < 0) {
        PyErr_Format(PyExc_ValueError, "gelu_many: need n >= 0; got %lld", a[3]);
        return NULL;
    }
    Elementwise e = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[1],
                     (float *)(uintptr_t)a[2], (Py_ssize_t)a[3], a[5] != 0, NULL};
    run_elementwise(&e, a[4]);
    Py_RETURN_NONE;
}

/* gelu_slope(x, y, d, n, threads): y = GELU(x) and d = GELU'(x), the tanh GELU, in one pass. */
static PyObject *gelu_slope(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (!int_args(args, nargs, 5, a, "gelu_slope(x, y, d, n, threads)"))
        return NULL;
    if (a[3] < 0) {
        PyErr_Format(PyExc_ValueError, "gelu_slope: need n >= 0; got %lld", a[3]);
        return NULL;
    }
    Elementwise e = {(const float *)(uintptr_t)a[0], NULL, (float *)(uintptr_t)a[1],
                     (Py_ssize_t)a[3], 0, (float *)(uintptr_t)a[2]};
    run_elementwise(&e, a[4]);
    Py_RETURN_NONE;
}

/* K[b, h, n_b + t, :] = k[b, h, t, :] and the same for V and v (ptr: K, V, k, v), with
 * n_b = lengths[b] where lengths are given, else n; s: the (b, h, t, d) strides of K, V, k, v. */
static void write_kv(const long long *ptr, long long B, long long H, long long T, long long D,
                     long long n, const long long *lengths, const long long *s) {
    for (int m = 0; m < 2; m++) { /* K from k, then V from v */
        float *dst = (float *)(uintptr_t)ptr[m];
        const float *src = (const float *)(uintptr_t)ptr[2 + m];
        const long long *sd = s + 4 * m, *ss = s + 8 + 4 * m;
        for (long long b = 0; b < B; b++) {
            const long long at = lengths ? lengths[b] : n;
            for (long long h = 0; h < H; h++)
                for (long long t = 0; t < T; t++) {
                    float *to = dst + b * sd[0] + h * sd[1] + (at + t) * sd[2];
                    const float *from = src + b * ss[0] + h * ss[1] + t * ss[2];
                    if (sd[3] == 1 && ss[3] == 1)
                        memcpy(to, from, sizeof(float) * (size_t)D);
                    else
                        for (long long d = 0; d < D; d++)
                            to[d * sd[3]] = from[d * ss[3]];
                }
        }
    }
}

/* kv_write(K, V, k, v, B, H, T, D, n, strides): K[b, h, n + t, :] = k[b, h, t, :] and the
 * same for V and v, strides a tuple of 16 ints: (b, h, t, d) of K, V, k and v. */
static PyObject *kv_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[9], s[16];
    if (nargs != 10 || !PyTuple_Check(args[9]) || PyTuple_GET_SIZE(args[9]) != 16) {
        PyErr_SetString(PyExc_TypeError, "kv_write(K, V, k, v, B, H, T, D, n, 16 strides)");
        return NULL;
    }
    if (!ints(args, 9, a) || !ints(&PyTuple_GET_ITEM(args[9], 0), 16, s))
        return NULL;
    if (a[4] < 0 || a[5] < 0 || a[6] < 0 || a[7] < 0 || a[8] < 0) {
        PyErr_SetString(PyExc_ValueError, "kv_write: negative size or position");
        return NULL;
    }
    write_kv(a, a[4], a[5], a[6], a[7], a[8], NULL, s);
    Py_RETURN_NONE;
}

/* add(a, b, y, n): y = a + b elementwise over n float32 values. */
static PyObject *add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[4];
    if (!int_args(args, nargs, 4, a, "add(a, b, y, n)"))
        return NULL;
    const float *x = (const float *)(uintptr_t)a[0], *z = (const float *)(uintptr_t)a[1];
    float *y = (float *)(uintptr_t)a[2];
    for (long long i = 0; i < a[3]; i++)
        y[i] = x[i] + z[i];
    Py_RETURN_NONE;
}

/* embed(W_E, tokens, P or 0, y, B, d, n_vocab, pos, positions or 0): y[b, :] =
 * W_E[tokens[b], :] (+ P[p_b, :], p_b = positions[b] if given, else pos) for B int64 tokens,
 * each checked against n_vocab. */
static PyObject *embed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[9];
    if (!int_args(args, nargs, 9, a, "embed(W_E, tokens, P, y, B, d, n_vocab, pos, positions)"))
        return NULL;
    const long long *positions = (const long long *)(uintptr_t)a[8];
    const float *W = (const float *)(uintptr_t)a[0], *P = (const float *)(uintptr_t)a[2];
    const long long *tokens = (const long long *)(uintptr_t)a[1];
    float *y = (float *)(uintptr_t)a[3];
    const long long B = a[4], d = a[5], n_vocab = a[6], pos = a[7];
    for (long long b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= n_vocab) {
            PyErr_Format(PyExc_ValueError, "tokens: id %lld is out of range [0, %lld) for n_vocab=%lld",
                         tokens[b], n_vocab, n_vocab);
            return NULL;
        }
    for (long long b = 0; b < B; b++) {
        const long long at = positions ? positions[b] : pos;
        const float *row = W + tokens[b] * d, *p = P ? P + at * d : NULL;
        float *out = y + b * d;
        for (long long i = 0; i < d; i++)
            out[i] = p ? row[i] + p[i] : row[i];
    }
    Py_RETURN_NONE;
}

/* kv_write_rows(K, V, k, v, B, H, D, lengths, strides): K[b, h, n_b, :] = k[b, h, 0, :] and
 * the same for V and v, n_b = lengths[b]; strides as kv_write's. */
static PyObject *kv_write_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[8], s[16];
    if (nargs != 9 || !PyTuple_Check(args[8]) || PyTuple_GET_SIZE(args[8]) != 16) {
        PyErr_SetString(PyExc_TypeError, "kv_write_rows(K, V, k, v, B, H, D, lengths, 16 strides)");
        return NULL;
    }
    if (!ints(args, 8, a) || !ints(&PyTuple_GET_ITEM(args[8], 0), 16, s))
        return NULL;
    write_kv(a, a[4], a[5], 1, a[6], 0, (const long long *)(uintptr_t)a[7], s);
    Py_RETURN_NONE;
}

/* advance(lengths, B, T): lengths[b] += T for b < B, int64. */
static PyObject *advance(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[3];
    if (!int_args(args, nargs, 3, a, "advance(lengths, B, T)"))
        return NULL;
    long long *lengths = (long long *)(uintptr_t)a[0];
    for (long long b = 0; b < a[1]; b++)
        lengths[b] += a[2];
    Py_RETURN_NONE;
}

/* The gradients of a clipping step: many float32 buffers, cut into chunks of SQ_CHUNK values
 * (one buffer's tail is a chunk of its own), the chunks shared among the parts. */
#define SQ_CHUNK 16384

typedef struct {
    float **x;          /* the buffers */
    long long *n;       /* their lengths */
    long long *first;   /* chunk index of each buffer's first chunk; first[count] = chunks */
    int count, chunks;
    double *sums;       /* one per chunk (sum_squares) */
    float factor;       /* scale_many */
} Buffers;

/* The buffer and offset of chunk c. */
static void chunk_at(const Buffers *b, int c, int *buf, long long *lo, long long *len) {
    int i = *buf;
    while (b->first[i + 1] <= c)
        i++;
    *buf = i;
    *lo = (c - b->first[i]) * (long long)SQ_CHUNK;
    *len = b->n[i] - *lo < SQ_CHUNK ? b->n[i] - *lo : SQ_CHUNK;
}

/* Each chunk of the part: its Σ x² into sums (sum_squares), else x ← factor · x (scale_many). */
static void chunks_part(const void *job, int part, int parts) {
    const Buffers *b = job;
    int lo, hi, buf = 0;
    share(b->chunks, 1, part, parts, &lo, &hi);
    for (int c = lo; c < hi; c++) {
        long long at, len;
        chunk_at(b, c, &buf, &at, &len);
        float *x = b->x[buf] + at;
        if (b->sums)
            b->sums[c] = SUM_SQ(x, (Py_ssize_t)len);
        else
            for (long long i = 0; i < len; i++)
                x[i] *= b->factor;
    }
}

/* Parses (addresses, lengths, ..., threads) into b (chunks laid out); False with an error set. */
static int buffers(PyObject *addresses, PyObject *lengths, Buffers *b) {
    if (!PyTuple_Check(addresses) || !PyTuple_Check(lengths) ||
        PyTuple_GET_SIZE(addresses) != PyTuple_GET_SIZE(lengths)) {
        PyErr_SetString(PyExc_TypeError, "need two tuples of equal length: addresses, lengths");
        return 0;
    }
    const Py_ssize_t count = PyTuple_GET_SIZE(addresses);
    if (count > INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "too many buffers");
        return 0;
    }
    b->count = (int)count;
    b->x = PyMem_Malloc(sizeof(float *) * (size_t)(count + 1));
    b->n = PyMem_Malloc(sizeof(long long) * (size_t)(count + 1));
    b->first = PyMem_Malloc(sizeof(long long) * (size_t)(count + 1));
    b->sums = NULL;
    if (!b->x || !b->n || !b->first) {
        PyErr_NoMemory();
        return 0;
    }
    long long chunks = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long a;
        if (!ints(&PyTuple_GET_ITEM(addresses, i), 1, &a) ||
            !ints(&PyTuple_GET_ITEM(lengths, i), 1, &b->n[i]))
            return 0;
        if (b->n[i] < 0) {
            PyErr_Format(PyExc_ValueError, "need lengths >= 0; got %lld", b->n[i]);
            return 0;
        }
        b->x[i] = (float *)(uintptr_t)a;
        b->first[i] = chunks;
        chunks += (b->n[i] + SQ_CHUNK - 1) / SQ_CHUNK;
        if (chunks > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "too many values");
            return 0;
        }
    }
    b->first[count] = chunks;
    b->chunks = (int)chunks;
    return 1;
}

static void free_buffers(Buffers *b) {
    PyMem_Free(b->x), PyMem_Free(b->n), PyMem_Free(b->first), PyMem_Free(b->sums);
}

/* The parts of a run over `items` units of work (chunks, blocks of rows, groups of columns)
 * on `threads` threads: 1 to 256, and no more than the items. */
static int part_count(long long threads, int items) {
    int parts = threads < 1 ? 1 : threads > 256 ? 256 : (int)threads;
    return parts < items ? parts : items > 0 ? items : 1;
}

/* sum_squares(addresses, lengths, threads) → Σ x² over every value, in float64, in a fixed
 * order (chunk by chunk): the same for any thread count. */
static PyObject *sum_squares(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long threads;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sum_squares(addresses, lengths, threads)");
        return NULL;
    }
    Buffers b = {0};
    if (!buffers(args[0], args[1], &b) || !ints(args + 2, 1, &threads)) {
        free_buffers(&b);
        return NULL;
    }
    b.sums = PyMem_Malloc(sizeof(double) * (size_t)(b.chunks + 1));
    if (!b.sums) {
        free_buffers(&b);
        return PyErr_NoMemory();
    }
    const int parts = part_count(threads, b.chunks);
    Py_BEGIN_ALLOW_THREADS
    run_parts(chunks_part, &b, parts);
    Py_END_ALLOW_THREADS
    double total = 0.0;
    for (int c = 0; c < b.chunks; c++)
        total += b.sums[c];
    free_buffers(&b);
    return PyFloat_FromDouble(total);
}

/* scale_many(addresses, lengths, factor, threads): x ← factor · x (float32) in every buffer. */
static PyObject *scale_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long threads;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scale_many(addresses, lengths, factor, threads)");
        return NULL;
    }
    Buffers b = {0};
    const double factor = PyFloat_AsDouble(args[2]);
    if ((factor == -1.0 && PyErr_Occurred()) || !buffers(args[0], args[1], &b) ||
        !ints(args + 3, 1, &threads)) {
        free_buffers(&b);
        return NULL;
    }
    b.factor = (float)factor;
    const int parts = part_count(threads, b.chunks);
    Py_BEGIN_ALLOW_THREADS
    run_parts(chunks_part, &b, parts);
    Py_END_ALLOW_THREADS
    free_buffers(&b);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------- norms with a backward -- */

/* A part of the forward (g NULL: NORM row by row, keeping μ and s) or of the backward: its
 * share of the blocks of rows. */
static void norm_train_part(const void *job, int part, int parts) {
    const NormJob *j = job;
    const int blocks = (int)((j->rows + NORM_BLOCK - 1) / NORM_BLOCK), d = j->d;
    int lo, hi;
    share(blocks, 1, part, parts, &lo, &hi);
    for (int blk = lo; blk < hi; blk++) {
        const long long r0 = (long long)blk * NORM_BLOCK;
        const long long r1 = r0 + NORM_BLOCK < j->rows ? r0 + NORM_BLOCK : j->rows;
        if (!j->g) {
            for (long long r = r0; r < r1; r++)
                NORM(j->x + r * d, j->w, j->b, j->y + r * d, d, j->eps, j->centred,
                     j->stats + 2 * r);
            continue;
        }
        float *pw = j->parts_w + (size_t)blk * d;
        float *pb = j->parts_b ? j->parts_b + (size_t)blk * d : NULL;
        memset(pw, 0, sizeof(float) * (size_t)d);
        if (pb)
            memset(pb, 0, sizeof(float) * (size_t)d);
        NORM_BACK(j, r0, r1, pw, pb, j->scratch + (size_t)part * 2 * (size_t)d);
    }
}

/* Whether rows and d are in range (else False with an error set); the blocks of rows. */
static int norm_rows(const char *name, long long rows, long long d, int *blocks) {
    if (rows < 0 || d < 1 || d > INT32_MAX / 2 || rows > INT32_MAX * (long long)NORM_BLOCK) {
        PyErr_Format(PyExc_ValueError, "%s: need rows >= 0 and 1 <= d < 2^30", name);
        return 0;
    }
    *blocks = (int)((rows + NORM_BLOCK - 1) / NORM_BLOCK);
    return 1;
}

/* norm_train(x, w, b or 0, y, stats, rows, d, eps, centred, threads) */
static PyObject *norm_train(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[7], centred, threads;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "norm_train(x, w, b, y, stats, rows, d, eps, centred, threads)");
        return NULL;
    }
    const double eps = PyFloat_AsDouble(args[7]);
    int blocks;
    if ((eps == -1.0 && PyErr_Occurred()) || !ints(args, 7, a) || !ints(args + 8, 1, &centred) ||
        !ints(args + 9, 1, &threads) || !norm_rows("norm_train", a[5], a[6], &blocks))
        return NULL;
    NormJob j = {0};
    j.x = (const float *)(uintptr_t)a[0], j.w = (const float *)(uintptr_t)a[1];
    j.b = (const float *)(uintptr_t)a[2], j.y = (float *)(uintptr_t)a[3];
    j.stats = (float *)(uintptr_t)a[4];
    j.rows = a[5], j.d = (int)a[6], j.eps = (float)eps, j.centred = centred != 0;
    Py_BEGIN_ALLOW_THREADS
    run_parts(norm_train_part, &j, part_count(threads, blocks));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* norm_train_backward(x, w, stats, g, dx, dw or 0, db or 0, rows, d, centred, threads) */
static PyObject *norm_train_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[11];
    int blocks;
    if (!int_args(args, nargs, 11, a,
                  "norm_train_backward(x, w, stats, g, dx, dw, db, rows, d, centred, threads)") ||
        !norm_rows("norm_train_backward", a[7], a[8], &blocks))
        return NULL;
    NormJob j = {0};
    j.x = (const float *)(uintptr_t)a[0], j.w = (const float *)(uintptr_t)a[1];
    j.stats = (float *)(uintptr_t)a[2], j.g = (const float *)(uintptr_t)a[3];
    j.dx = (float *)(uintptr_t)a[4];
    float *dw = (float *)(uintptr_t)a[5], *db = (float *)(uintptr_t)a[6];
    j.rows = a[7], j.d = (int)a[8], j.centred = a[9] != 0;
    const size_t d = (size_t)j.d;
    const int parts = part_count(a[10], blocks);
    /* the blocks' partial dw (and db), then each part's scratch */
    const size_t n_parts = (size_t)blocks * d * (db ? 2 : 1);
    j.parts_w = PyMem_Malloc(sizeof(float) * (n_parts + 2 * d * (size_t)parts));
    if (!j.parts_w)
        return PyErr_NoMemory();
    j.parts_b = db ? j.parts_w + (size_t)blocks * d : NULL;
    j.scratch = j.parts_w + n_parts;
    Py_BEGIN_ALLOW_THREADS
    run_parts(norm_train_part, &j, parts);
    for (size_t i = 0; i < d; i++) { /* the blocks' sums, block by block, in float64 */
        double sw = 0.0, sb = 0.0;
        for (int blk = 0; blk < blocks; blk++) {
            sw += j.parts_w[(size_t)blk * d + i];
            if (db)
                sb += j.parts_b[(size_t)blk * d + i];
        }
        if (dw)
            dw[i] = (float)sw;
        if (db)
            db[i] = (float)sb;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(j.parts_w);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------- transposition -- */

static void transpose_part(const void *job, int part, int parts) {
    const Transpose *t = job;
    int lo, hi;
    share((int)t->cols, 8, part, parts, &lo, &hi);
    TRANSPOSE(t, lo, hi);
}

/* transpose(x, y, rows, cols, threads): y [cols, rows] = xᵀ for x [rows, cols] (float32). */
static PyObject *transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (!int_args(args, nargs, 5, a, "transpose(x, y, rows, cols, threads)"))
        return NULL;
    if (a[2] < 0 || a[3] < 0 || a[3] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "transpose: need rows >= 0 and 0 <= cols < 2^31");
        return NULL;
    }
    Transpose t = {(const float *)(uintptr_t)a[0], (float *)(uintptr_t)a[1], a[2], a[3]};
    Py_BEGIN_ALLOW_THREADS
    run_parts(transpose_part, &t, part_count(a[4], (int)((a[3] + 7) / 8)));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* argmax_rows(z, B, V, stride) → [the first index of the largest of V values of each row of
 * z, rows stride floats apart], or None where a row holds a NaN or has an infinite largest
 * value. A list, not a tensor: after a decoding step's weights streamed through every cache,
 * each PyTorch operation (its code cold) took 30-50 µs. */
static PyObject *argmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[4];
    if (!int_args(args, nargs, 4, a, "argmax_rows(z, B, V, stride)"))
        return NULL;
    if (a[1] < 0 || a[2] <= 0 || a[2] > INT32_MAX || a[3] < a[2]) {
        PyErr_SetString(PyExc_ValueError, "argmax_rows: need B >= 0 and 0 < V <= stride, V < 2^31");
        return NULL;
    }
    const float *z = (const float *)(uintptr_t)a[0];
    PyObject *ids = PyList_New((Py_ssize_t)a[1]);
    if (!ids)
        return NULL;
    for (long long b = 0; b < a[1]; b++) {
        int finite;
        const long long k = ARGMAX(z + b * a[3], a[2], &finite);
        PyObject *id = finite ? PyLong_FromLongLong(k) : NULL;
        if (!id) {
            Py_DECREF(ids);
            if (finite)
                return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(ids, (Py_ssize_t)b, id);
    }
    return ids;
}

static PyMethodDef methods[] = {
    {"argmax_rows", (PyCFunction)(void (*)(void))argmax_rows, METH_FASTCALL,
     "argmax_rows(z, B, V, stride) -> each row's first largest index, or None where a row is not finite"},
    {"kv_write_rows", (PyCFunction)(void (*)(void))kv_write_rows, METH_FASTCALL,
     "kv_write_rows(K, V, k, v, B, H, D, lengths, strides): K[b, :, lengths[b]] = k[b, :, 0]"},
    {"advance", (PyCFunction)(void (*)(void))advance, METH_FASTCALL,
     "advance(lengths, B, T): lengths[:B] += T (int64)"},
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL, "add(a, b, y, n): y = a + b"},
    {"embed", (PyCFunction)(void (*)(void))embed, METH_FASTCALL,
     "embed(W_E, tokens, P, y, B, d, n_vocab, pos, positions): y[b] = W_E[tokens[b]] (+ P[·])"},
    {"norm", (PyCFunction)(void (*)(void))norm, METH_FASTCALL,
     "norm(x, w, b, y, rows, d, eps, centred): layer norm (centred) or RMS norm of each row"},
    {"gelu_slope", (PyCFunction)(void (*)(void))gelu_slope, METH_FASTCALL,
     "gelu_slope(x, y, d, n, threads): y = GELU(x), d = GELU'(x) (tanh), in one pass"},
    {"gelu_many", (PyCFunction)(void (*)(void))gelu_many, METH_FASTCALL,
     "gelu_many(x, g, y, n, threads, exact): y = GELU(x) (g = 0) or g GELU'(x), in parallel"},
    {"kv_write", (PyCFunction)(void (*)(void))kv_write, METH_FASTCALL,
     "kv_write(K, V, k, v, B, H, T, D, n, strides): K[:, :, n:n+T] = k, V[:, :, n:n+T] = v"},
    {"sum_squares", (PyCFunction)(void (*)(void))sum_squares, METH_FASTCALL,
     "sum_squares(addresses, lengths, threads): the sum of x² over float32 buffers, in float64"},
    {"scale_many", (PyCFunction)(void (*)(void))scale_many, METH_FASTCALL,
     "scale_many(addresses, lengths, factor, threads): x *= factor in each float32 buffer"},
    {"norm_train", (PyCFunction)(void (*)(void))norm_train, METH_FASTCALL,
     "norm_train(x, w, b, y, stats, rows, d, eps, centred, threads): a norm, keeping μ, s"},
    {"norm_train_backward", (PyCFunction)(void (*)(void))norm_train_backward, METH_FASTCALL,
     "norm_train_backward(x, w, stats, g, dx, dw, db, rows, d, centred, threads)"},
    {"transpose", (PyCFunction)(void (*)(void))transpose, METH_FASTCALL,
     "transpose(x, y, rows, cols, threads): y [cols, rows] = the transpose of x [rows, cols]"},
    {"kernel", kernel_name, METH_NOARGS, "the kernels in use: 'avx2' or 'portable'"},
    {"use_portable", use_portable, METH_O, "use_portable(flag): force the portable loops (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowwise",
                                    "Norms, the tanh GELU and its slope, and a KV cache's writes, float32.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__rowwise(void) {
    pick_kernels(0);
    return PyModule_Create(&module);
}
