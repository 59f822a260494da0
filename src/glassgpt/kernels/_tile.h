/* Small matrix products for glassgpt's training attention kernel (_flash.c), float32:
 *
 *   C[r, n] = α_r Σ_k A[r·ar + k·ak] B[k·ldb + n]   for r < M ≤ 6, n < N ≤ 16, k < K
 *
 * A is read one element at a time (any strides: a matrix or its transpose), B a row of N
 * contiguous values at a time, readable up to the next multiple of 8 columns (the
 * callers pad their copies); C's rows are N contiguous values, ldc apart. With AVX2 + FMA
 * the M × 16 block of C stays in 12 registers across k (the usual 6 × 16 register tile);
 * the portable loop is the same sum in plain C. Include after _cpu.h.
 */
#ifndef GLASSGPT_TILE_H
#define GLASSGPT_TILE_H

#define TILE_M 6  /* rows of C per tile */
#define TILE_N 16 /* columns of C per tile */

typedef void (*TileFn)(int M, int N, int K, const float *A, long long ar, long long ak,
                       const float *B, long long ldb, float *C, long long ldc, const float *alpha);

static void tile_portable(int M, int N, int K, const float *A, long long ar, long long ak,
                          const float *B, long long ldb, float *C, long long ldc, const float *alpha) {
    for (int r = 0; r < M; r++) {
        float acc[TILE_N] = {0};
        for (int k = 0; k < K; k++) {
            const float a = A[r * ar + k * ak];
            for (int n = 0; n < N; n++)
                acc[n] += a * B[k * ldb + n];
        }
        for (int n = 0; n < N; n++)
            C[r * ldc + n] = alpha[r] * acc[n];
    }
}

#if GG_X86
/* Lanes [0, n) of 8 on (a maskstore's mask). */
AVX2 static inline __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Six rows always (rows past M repeat row 0 and are not stored), so that the 12
 * accumulators are named registers; one or two vectors of columns. */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define ROW_PTR(r) const float *a##r = r < M ? A + r * ar : A;
#define ZERO(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = c##r##0;
#define FMA1(r)                                                                               \
    {                                                                                         \
        const __m256 x = _mm256_broadcast_ss(a##r + o);                                       \
        c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0);                                            \
    }
#define FMA2(r)                                                                               \
    {                                                                                         \
        const __m256 x = _mm256_broadcast_ss(a##r + o);                                       \
        c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0);                                            \
        c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1);                                            \
    }
#define STORE(r)                                                                              \
    if (r < M) {                                                                              \
        float *cr = C + r * ldc;                                                              \
        const __m256 al = _mm256_set1_ps(alpha[r]);                                           \
        if (N > 8) {                                                                          \
            _mm256_storeu_ps(cr, _mm256_mul_ps(al, c##r##0));                                 \
            last = c##r##1, cr += 8;                                                          \
        } else {                                                                              \
            last = c##r##0;                                                                   \
        }                                                                                     \
        if (full)                                                                             \
            _mm256_storeu_ps(cr, _mm256_mul_ps(al, last));                                    \
        else                                                                                  \
            _mm256_maskstore_ps(cr, tail, _mm256_mul_ps(al, last));                           \
    }

/* The k loop for A read along its rows (ak = 1: six row pointers, k an index) or down its
 * columns (ar = 1: one pointer, the rows at fixed offsets), else any strides. */
#define K_LOOP(FMA, LOAD_B, ADDR, STEP)                                                       \
    for (int k = 0; k < K; k++, B += ldb) {                                                   \
        LOAD_B;                                                                               \
        ROWS(FMA)                                                                             \
        STEP;                                                                                 \
    }
#define LOAD1 const __m256 b0 = _mm256_loadu_ps(B)
#define LOAD2 const __m256 b0 = _mm256_loadu_ps(B), b1 = _mm256_loadu_ps(B + 8)

AVX2 static void tile_avx2(int M, int N, int K, const float *A, long long ar, long long ak,
                           const float *B, long long ldb, float *C, long long ldc, const float *alpha) {
    ROWS(ROW_PTR)
    ROWS(ZERO)
    long long o = 0;
    if (ak == 1 && N > 8) {
        K_LOOP(FMA2, LOAD2, , o++)
    } else if (ak == 1) {
        K_LOOP(FMA1, LOAD1, , o++)
    } else if (ar == 1 && M == TILE_M) { /* rows at a0 + r: one pointer */
        a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5;
        if (N > 8) {
            K_LOOP(FMA2, LOAD2, , o += ak)
        } else {
            K_LOOP(FMA1, LOAD1, , o += ak)
        }
    } else if (N > 8) {
        K_LOOP(FMA2, LOAD2, , o += ak)
    } else {
        K_LOOP(FMA1, LOAD1, , o += ak)
    }
    const int rest = N > 8 ? N - 8 : N, full = rest == 8;
    const __m256i tail = lanes_below(rest);
    __m256 last;
    ROWS(STORE)
}
#endif

#endif
