/* The row-wise maps of glassgpt's training attention kernel (_flash.c), float32: a block's
 * softmax and the backward's exp(S − lse) and P ∘ (dP − Δ) over rows of scores, row copies
 * and 8 × 8 transposes into its scratch; each with AVX2 + FMA (exp by _vexp.h's exp8) and
 * as a portable loop (libm's expf), picked at run time by pick_kernels (which picks
 * _tile.h's product too). Include once, after _cpu.h and _tile.h.
 */
#ifndef GLASSGPT_FLASH_ROWS_H
#define GLASSGPT_FLASH_ROWS_H

#include <math.h>
#include <string.h>

/* The row maps, each over s[0, w) (w a multiple of 8, the row readable that far) with the
 * first n entries kept and the rest set to 0:
 *   softmax(S, ld, M, n, w, lse, inv)   for rows r < M of S (ld apart), n + r entries kept:
 *                            s_j ← exp(s_j − m) (m the row's maximum), inv_r = 1/Σ_j s_j,
 *                            lse_r = m + log Σ (the normalisation is left to z's tile); the
 *                            maxima first, then the exps, so that rows overlap;
 *   exps(s, n, w, lse)       s_j ← exp(s_j − lse);
 *   dscores(p, dp, n, w, Δ)  dp_j ← p_j (dp_j − Δ). */
typedef void (*SoftmaxFn)(float *S, long long ld, int M, int n, int w, float *lse, float *inv);
typedef void (*ExpsFn)(float *s, int n, int w, float lse);
typedef void (*DScoresFn)(const float *p, float *dp, int n, int w, float delta);

static void softmax_portable(float *S, long long ld, int M, int n, int w, float *lse,
                             float *inv) {
    for (int r = 0; r < M; r++) {
        float *s = S + r * ld, m = -INFINITY, total = 0.0f;
        for (int j = 0; j < n + r; j++)
            m = s[j] > m ? s[j] : m;
        for (int j = 0; j < n + r; j++)
            total += (s[j] = expf(s[j] - m));
        memset(s + n + r, 0, sizeof(float) * (size_t)(w - n - r));
        inv[r] = 1.0f / total;
        lse[r] = m + logf(total);
    }
}

static void exps_portable(float *s, int n, int w, float lse) {
    for (int j = 0; j < n; j++)
        s[j] = expf(s[j] - lse);
    memset(s + n, 0, sizeof(float) * (size_t)(w - n));
}

static void dscores_portable(const float *p, float *dp, int n, int w, float delta) {
    for (int j = 0; j < n; j++)
        dp[j] = p[j] * (dp[j] - delta);
    memset(dp + n, 0, sizeof(float) * (size_t)(w - n));
}

#if GG_X86
#include "_vexp.h"

AVX2 static float hsum(__m256 x) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Lanes j + [0, 8) below n, as a float mask. */
AVX2 static inline __m256 kept(int n, int j) { return _mm256_castsi256_ps(lanes_below(n - j)); }

AVX2 static void softmax_avx2(float *S, long long ld, int M, int n, int w, float *lse,
                              float *inv) {
    float top[TILE_M];
    for (int r = 0; r < M; r++) {
        const float *s = S + r * ld;
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < n + r; j += 8)
            m = _mm256_max_ps(m, _mm256_blendv_ps(m, _mm256_loadu_ps(s + j), kept(n + r, j)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        top[r] = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    }
    for (int r = 0; r < M; r++) {
        float *s = S + r * ld;
        const __m256 m = _mm256_set1_ps(top[r]);
        __m256 total = _mm256_setzero_ps();
        for (int j = 0; j < w; j += 8) {
            __m256 e = _mm256_and_ps(kept(n + r, j), exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m)));
            _mm256_storeu_ps(s + j, e);
            total = _mm256_add_ps(total, e);
        }
        inv[r] = hsum(total); /* the sum, for now */
    }
    for (int r = 0; r < M; r++) {
        lse[r] = top[r] + logf(inv[r]);
        inv[r] = 1.0f / inv[r];
    }
}

/* dst[d·Tp + t] = rows[t·Dp + d] by 8 × 8 blocks (the padding included). */
AVX2 static void transpose_avx2(float *dst, const float *rows, int T, int D, int Tp, int Dp) {
    for (int t0 = 0; t0 < T; t0 += 8)
        for (int d0 = 0; d0 < D; d0 += 8) {
            __m256 r[8], u[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_ps(rows + (size_t)(t0 + i) * Dp + d0);
            for (int i = 0; i < 8; i += 2) {
                u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
                r[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
                r[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                r[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) {
                float *o = dst + (size_t)(d0 + i) * Tp + t0;
                _mm256_storeu_ps(o, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                _mm256_storeu_ps(o + (size_t)4 * Tp, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
            }
        }
}

/* dst[d] = α x[d] for d < D, and 0 on to the next multiple of 8 (dst is that long). */
AVX2 static void copy_row_avx2(float *dst, const float *x, int D, float alpha) {
    const __m256 a = _mm256_set1_ps(alpha);
    int d = 0;
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(a, _mm256_loadu_ps(x + d)));
    if (d < D)
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(a, _mm256_maskload_ps(x + d, lanes_below(D - d))));
}

AVX2 static void exps_avx2(float *s, int n, int w, float lse) {
    const __m256 l = _mm256_set1_ps(lse);
    for (int j = 0; j < w; j += 8)
        _mm256_storeu_ps(s + j, _mm256_and_ps(kept(n, j),
                                              exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), l))));
}

AVX2 static void dscores_avx2(const float *p, float *dp, int n, int w, float delta) {
    const __m256 d = _mm256_set1_ps(delta);
    for (int j = 0; j < w; j += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(p + j), _mm256_sub_ps(_mm256_loadu_ps(dp + j), d));
        _mm256_storeu_ps(dp + j, _mm256_and_ps(kept(n, j), x));
    }
}
#endif

typedef void (*TransposeFn)(float *dst, const float *rows, int T, int D, int Tp, int Dp);
typedef void (*CopyRowFn)(float *dst, const float *x, int D, float alpha);

/* dst[d] = α x[d] for d < D. */
static void copy_row_portable(float *dst, const float *x, int D, float alpha) {
    for (int d = 0; d < D; d++)
        dst[d] = alpha * x[d];
}

/* dst[d·Tp + t] = rows[t·Dp + d]. */
static void transpose_portable(float *dst, const float *rows, int T, int D, int Tp, int Dp) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
            dst[(size_t)d * Tp + t] = rows[(size_t)t * Dp + d];
}

static TileFn TILE;
static TransposeFn TRANSPOSE;
static CopyRowFn COPY_ROW;
static SoftmaxFn SOFTMAX;
static ExpsFn EXPS;
static DScoresFn DSCORES;
static const char *KERNEL_NAME;

static void pick_kernels(int portable) {
    TILE = tile_portable, TRANSPOSE = transpose_portable, COPY_ROW = copy_row_portable;
    SOFTMAX = softmax_portable;
    EXPS = exps_portable;
    DSCORES = dscores_portable, KERNEL_NAME = "portable";
#if GG_X86
    if (!portable && cpu_has_avx2()) {
        TILE = tile_avx2, TRANSPOSE = transpose_avx2, COPY_ROW = copy_row_avx2;
        SOFTMAX = softmax_avx2;
        EXPS = exps_avx2, DSCORES = dscores_avx2;
        KERNEL_NAME = "avx2";
    }
#endif
}

#endif
