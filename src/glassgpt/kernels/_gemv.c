/* Small-batch products for decoding: y = x W + b for M ≤ 32 rows of x, at memory bandwidth.
 *
 * At batch 1 a decoding step reads every weight once and does two flops per weight read,
 * so it costs the weight bytes over the memory bandwidth. This kernel streams each weight
 * once for all M rows, W [K, N] row-major, row by row:
 *
 *   y[m, :] = b + Σ_k x[m, k] · W[k, :]
 *
 * with float32 products and sums (AVX2 + FMA where the CPU has them, plain C otherwise).
 * W is float32 or bfloat16 (gemv_rows_bf16: stored as uint16, each value widened exactly to
 * float32 as it is read, eight at a time by a zero-extend and a 16-bit shift; a whole bf16
 * panel, below, a 32-bit lane of two weights at a time by a shift and a mask), x, b and y
 * float32 in both: the result of a bf16 product with float32 accumulation, at half the
 * bytes read, on CPUs without native bf16 arithmetic. One kernel body serves both formats.
 * The rows of W are split over PyTorch's own OpenMP threads (see run_parts), each streaming
 * one contiguous band of W into its own partial sums, which are added at the end.
 *
 * One row of x (a decoding step) can instead take W in panels: a copy of W [K, N] as
 * P[⌈N/64⌉, K, 64], P[p, k, c] = W[k, 64p + c] (zeros past N), so that each panel of 64
 * outputs is one contiguous run of memory. A thread streams its panels one after another,
 * the 64 sums of a panel held in registers: one stream a thread, where the rows form reads
 * four rows of W at a time (four streams) and reads and writes y between them. Over GPT-2
 * small's block matrices (2.4-9.4 MB each) the panels streamed at 28-31 GB/s where the rows
 * form streamed at 24-26 and a plain sum of the same matrices read 28-31 (2 threads, an
 * AVX-512 EPYC). Each output's sum runs over k in order on one thread. On CPUs with AVX-512F
 * several rows of x (M ≤ 32: batched decoding, a short prompt) take the panels too, in one
 * call: each panel is read from memory once, for its first ROW_BLOCK rows (6 × 64 sums in
 * 24 of the 32 vector registers, each weight read once for six rows), then from the cache
 * for the next six, and so on (bench/step_ab.py --rows, and bench/rows.py, time it).
 * The threads share the panels by slices of 16 outputs (a panel may be split between two),
 * so that an odd count of panels still splits evenly; each output's sum is the same either way.
 * The GIL is released while they run.
 *
 * Python API (pointers are addresses of contiguous buffers, float32 but for the bf16 W;
 * the caller checks shapes, dtypes and contiguity):
 *   gemv_rows(x, W, b or 0, y, M, K, N, threads)        W float32
 *   gemv_rows_bf16(x, W, b or 0, y, M, K, N, threads)   W bfloat16
 *   gemv_rows_bf16_io(x, W, b or 0, y, M, K, N, threads)   W, x, b and y bfloat16: x and b
 *                   widened here, y rounded to nearest (ties to even) at the end, which
 *                   saves a bf16 decoding step's three conversions per product in Python
 *   gemv_panels(x, P, b or 0, y, M, K, N, threads)  W float32 in panels (above):
 *                   y [M, N] = x [M, K] W + b, for M = 1, or M ≤ 32 where panels_rows() says
 *   gemv_panels_bf16(x, P, b or 0, y, M, K, N, threads)  the same with P bfloat16, x, b
 *                   and y float32: bf16 weights under float32 activations (a replayed
 *                   bf16 decoding step, glassgpt.model.precision.decoding_copy)
 *   gemv_panels_bf16_io(x, P, b or 0, y, M, K, N, threads)  the same with P, x, b and y
 *                   bfloat16, as gemv_rows_bf16_io takes them (a bf16 decoding step)
 *   gemv_panels_add(x, P, b, y, M, K, N, threads, half, r, out)   gemv_panels (half: P
 *                   bfloat16, x, b, y float32), then out = r + y, in one parallel run
 *   gemv_panels_glu(x, Pa, ba, a, Pg, bg, g, M, K, N, threads, half, s, h, silu_avx2)
 *                   a = x Wa + ba and g = x Wg + bg, then s = silu(g) (_silu.h's AVX2 or
 *                   portable loop) and h = s ⊙ a, in one parallel run: SwiGLU's products
 *                   (both fused calls: glassgpt.kernels.fusion, bit for bit the separate calls)
 *   panels_rows() -> the most rows of x gemv_panels takes (32 with AVX-512F, else 1)
 *   has_avx2() -> bool; kernel() -> "avx2" or "portable"; use_portable(flag) (tests)
 *   wide_registers(flag) -> whether the AVX-512F panels are in use (False: the AVX2 ones)
 *   solo_for(ns): the parts run one after another on the caller for the next ns
 *   (as after slow parallel runs, see _parallel.h; 0 ends it)
 *   pace_run(start_ns, end_ns, own_ns, parts) -> whether the parts run one after another
 *   at end_ns, after one parallel run of those times given to the pacing (tests)
 *   pacing_counts() -> (parallel runs, runs one after another that would have been
 *   parallel, solo windows begun) so far, of every glassgpt extension's calls in the
 *   process (one pacing: _parallel.h; bench/step_profile.py)
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_cpu.h"
#include "_parallel.h"
#if GG_X86
#include "_vexp.h"
#endif
#include "_silu.h"

#define MAX_ROWS 32
#define MAX_THREADS 256

typedef struct {
    const float *x, *b;
    const void *W; /* float32, or bfloat16 (uint16_t) where bf16 */
    float *y;
    int M, K, N, bf16;
    float *partial; /* rows form: parts 1, 2, ... sum their rows of W into [M, N] each here */
} Job;

/* A bfloat16 as float32: it is the top 16 bits of the float32 it stands for, so the
 * conversion is exact. */
static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* W's element i as float32. */
static inline float weight(const void *W, size_t i, int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)W)[i]) : ((const float *)W)[i];
}

#define PANEL 64         /* outputs a panel */
#define PANEL_ROWS_MAX MAX_ROWS /* rows of x the panels form takes, with AVX-512F */
#define ROW_BLOCK 6 /* rows of x a pass over a panel's weights (AVX-512F: 6 × 4 sums of 16) */
_Static_assert(ROW_BLOCK == 6, "panel_avx512_body and pairs_bf16 switch over 1-6 rows");
#define SLICE 16         /* columns of a panel: the threads share a product's slices */

/* ------------------------------------------------------------------- plain C kernels -- */

/* rows form, rows k0 ≤ k < k1 of W: out[m, :] = bias + Σ_k x[m, k] · W[k, :] */
static void rows_plain(const Job *j, float *out, const float *bias, int k0, int k1) {
    const int M = j->M, K = j->K, N = j->N, bf16 = j->bf16;
    for (int m = 0; m < M; m++) {
        float *y = out + (size_t)m * N;
        for (int n = 0; n < N; n++)
            y[n] = bias ? bias[n] : 0.0f;
        for (int k = k0; k < k1; k++) {
            const size_t w = (size_t)k * N;
            float xk = j->x[(size_t)m * K + k];
            for (int n = 0; n < N; n++)
                y[n] += xk * weight(j->W, w + n, bf16);
        }
    }
}

/* Columns c0 ≤ c < c1 of panel p's sums for row m (acc[c]) into y, plus the bias, up to N. */
static inline void panel_out(const Job *j, int p, int m, const float *acc, int c0, int c1) {
    float *y = j->y + (size_t)m * j->N + (size_t)p * PANEL;
    const float *b = j->b ? j->b + (size_t)p * PANEL : NULL;
    const int n = j->N - p * PANEL < c1 ? j->N - p * PANEL : c1;
    for (int c = c0; c < n; c++)
        y[c] = acc[c] + (b ? b[c] : 0.0f);
}

/* y[m, 64p + c] = b + Σ_k x[m, k] P[p, k, c] for the slices q0 ≤ q < q1 (16 columns each:
 * 16q ≤ c < 16q + 16) of panel p, every row m of x, each sum over k in order (64p + c < N). */
static void panels_plain(const Job *j, int p, int q0, int q1) {
    const int c0 = q0 * SLICE, c1 = q1 * SLICE;
    for (int m = 0; m < j->M; m++) {
        float acc[PANEL] = {0};
        size_t w = (size_t)p * j->K * PANEL;
        const float *x = j->x + (size_t)m * j->K;
        for (int k = 0; k < j->K; k++, w += PANEL)
            for (int c = c0; c < c1; c++)
                acc[c] += x[k] * weight(j->W, w + c, j->bf16);
        panel_out(j, p, m, acc, c0, c1);
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA kernels -- */
#if GG_X86

/* W's elements i..i+8 as float32: eight uint16 widened to 32 bits and shifted up 16. */
AVX2 static inline __attribute__((always_inline)) __m256 load8(const void *W, size_t i,
                                                                int bf16) {
    if (!bf16)
        return _mm256_loadu_ps((const float *)W + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)W + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* rows form, rows k0 ≤ k < k1 of W, eight (or four) at a time: each thread streams one
 * contiguous band of W, and the M output rows stay in L1 or L2. The rows are taken a chunk
 * of columns at a time, small enough that the chunk's M rows of y and eight rows of W stay
 * in L1, so that with several rows of x each W value is read from L1 after the first.
 * One body for both weight formats: `bf16` is a constant in each caller below. */
static int chunk_columns(int M) { return M <= 16 ? 256 : 128; }

AVX2 static inline __attribute__((always_inline)) void
rows_avx2_body(const Job *j, float *out, const float *bias, int k0, int k1, const int bf16) {
    const int M = j->M, K = j->K, N = j->N, nv = N / 8 * 8, CHUNK = chunk_columns(M);
    const void *W = j->W;
    for (int m = 0; m < M; m++) {
        if (bias)
            memcpy(out + (size_t)m * N, bias, sizeof(float) * N);
        else
            memset(out + (size_t)m * N, 0, sizeof(float) * N);
    }
    int k = k0;
    for (; k + 8 <= k1 && M > 1; k += 8) { /* eight rows of W at a time: y read once per 8 */
        const size_t w = (size_t)k * N;
        for (int c = 0; c < nv; c += CHUNK) {
            const int c1 = c + CHUNK < nv ? c + CHUNK : nv;
            for (int m = 0; m < M; m++) {
                const float *x = j->x + (size_t)m * K + k;
                __m256 xs[8];
                for (int r = 0; r < 8; r++)
                    xs[r] = _mm256_set1_ps(x[r]);
                float *y = out + (size_t)m * N;
                for (int n = c; n < c1; n += 8) {
                    const size_t i = w + n;
                    __m256 a = _mm256_loadu_ps(y + n);
                    __m256 b = _mm256_mul_ps(xs[1], load8(W, i + N, bf16));
                    a = _mm256_fmadd_ps(xs[0], load8(W, i, bf16), a);
                    a = _mm256_fmadd_ps(xs[2], load8(W, i + 2 * (size_t)N, bf16), a);
                    b = _mm256_fmadd_ps(xs[3], load8(W, i + 3 * (size_t)N, bf16), b);
                    a = _mm256_fmadd_ps(xs[4], load8(W, i + 4 * (size_t)N, bf16), a);
                    b = _mm256_fmadd_ps(xs[5], load8(W, i + 5 * (size_t)N, bf16), b);
                    a = _mm256_fmadd_ps(xs[6], load8(W, i + 6 * (size_t)N, bf16), a);
                    b = _mm256_fmadd_ps(xs[7], load8(W, i + 7 * (size_t)N, bf16), b);
                    _mm256_storeu_ps(y + n, _mm256_add_ps(a, b));
                }
            }
        }
        for (int m = 0; m < M; m++) {
            const float *x = j->x + (size_t)m * K + k;
            float *y = out + (size_t)m * N;
            for (int n = nv; n < N; n++)
                for (int r = 0; r < 8; r++)
                    y[n] += x[r] * weight(W, w + (size_t)r * N + n, bf16);
        }
    }
    for (; k + 4 <= k1; k += 4) {
        const size_t w0 = (size_t)k * N, w1 = w0 + N, w2 = w1 + N, w3 = w2 + N;
        for (int c = 0; c < nv; c += CHUNK) {
            const int c1 = c + CHUNK < nv ? c + CHUNK : nv;
            for (int m = 0; m < M; m++) {
                const float *x = j->x + (size_t)m * K + k;
                __m256 x0 = _mm256_set1_ps(x[0]), x1 = _mm256_set1_ps(x[1]);
                __m256 x2 = _mm256_set1_ps(x[2]), x3 = _mm256_set1_ps(x[3]);
                float *y = out + (size_t)m * N;
                for (int n = c; n < c1; n += 8) {
                    __m256 a = _mm256_loadu_ps(y + n);
                    a = _mm256_fmadd_ps(x0, load8(W, w0 + n, bf16), a);
                    a = _mm256_fmadd_ps(x1, load8(W, w1 + n, bf16), a);
                    a = _mm256_fmadd_ps(x2, load8(W, w2 + n, bf16), a);
                    a = _mm256_fmadd_ps(x3, load8(W, w3 + n, bf16), a);
                    _mm256_storeu_ps(y + n, a);
                }
            }
        }
        for (int m = 0; m < M; m++) {
            const float *x = j->x + (size_t)m * K + k;
            float *y = out + (size_t)m * N;
            for (int n = nv; n < N; n++)
                y[n] += x[0] * weight(W, w0 + n, bf16) + x[1] * weight(W, w1 + n, bf16) +
                        x[2] * weight(W, w2 + n, bf16) + x[3] * weight(W, w3 + n, bf16);
        }
    }
    for (; k < k1; k++) {
        const size_t w = (size_t)k * N;
        for (int m = 0; m < M; m++) {
            float xk = j->x[(size_t)m * K + k], *y = out + (size_t)m * N;
            __m256 xv = _mm256_set1_ps(xk);
            for (int n = 0; n < nv; n += 8)
                _mm256_storeu_ps(y + n, _mm256_fmadd_ps(xv, load8(W, w + n, bf16),
                                                        _mm256_loadu_ps(y + n)));
            for (int n = nv; n < N; n++)
                y[n] += xk * weight(W, w + n, bf16);
        }
    }
}

AVX2 static void rows_avx2(const Job *j, float *out, const float *bias, int k0, int k1) {
    rows_avx2_body(j, out, bias, k0, k1, 0);
}

AVX2 static void rows_avx2_bf16(const Job *j, float *out, const float *bias, int k0, int k1) {
    rows_avx2_body(j, out, bias, k0, k1, 1);
}

/* panels_plain for one row of x and a whole float32 panel p, the 64 sums in eight
 * registers, W read once, in order (bf16 panels: panel_avx2_bf16). */
AVX2 static void panel_avx2_f32(const Job *j, int p) {
    const int half = 0;
    const int K = j->K;
    size_t w = (size_t)p * K * PANEL;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (int k = 0; k < K; k++, w += PANEL) {
        const __m256 xk = _mm256_broadcast_ss(j->x + k);
        a0 = _mm256_fmadd_ps(xk, load8(j->W, w, half), a0);
        a1 = _mm256_fmadd_ps(xk, load8(j->W, w + 8, half), a1);
        a2 = _mm256_fmadd_ps(xk, load8(j->W, w + 16, half), a2);
        a3 = _mm256_fmadd_ps(xk, load8(j->W, w + 24, half), a3);
        a4 = _mm256_fmadd_ps(xk, load8(j->W, w + 32, half), a4);
        a5 = _mm256_fmadd_ps(xk, load8(j->W, w + 40, half), a5);
        a6 = _mm256_fmadd_ps(xk, load8(j->W, w + 48, half), a6);
        a7 = _mm256_fmadd_ps(xk, load8(j->W, w + 56, half), a7);
    }
    float acc[PANEL];
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1);
    _mm256_storeu_ps(acc + 16, a2), _mm256_storeu_ps(acc + 24, a3);
    _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6), _mm256_storeu_ps(acc + 56, a7);
    panel_out(j, p, 0, acc, 0, PANEL);
}

/* The same for the slices q0 ≤ q < q1 of panel p (a part's first or last panel, shared with
 * the next or previous part): the same sums, element by element, in fewer registers. */
AVX2 static inline __attribute__((always_inline)) void
slices_avx2_body(const Job *j, int p, int q0, int q1, const int half) {
    const int K = j->K, g0 = 2 * q0, g1 = 2 * q1;
    size_t w = (size_t)p * K * PANEL;
    __m256 a[PANEL / 8];
    for (int g = g0; g < g1; g++)
        a[g] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++, w += PANEL) {
        const __m256 xk = _mm256_broadcast_ss(j->x + k);
        for (int g = g0; g < g1; g++)
            a[g] = _mm256_fmadd_ps(xk, load8(j->W, w + 8 * (size_t)g, half), a[g]);
    }
    float acc[PANEL];
    for (int g = g0; g < g1; g++)
        _mm256_storeu_ps(acc + 8 * g, a[g]);
    panel_out(j, p, 0, acc, q0 * SLICE, q1 * SLICE);
}

/* panel_avx2_f32 for a bf16 panel, widened sixteen weights (one 32-byte load) at a time in
 * two operations, as pairs_rows_bf16 does with AVX-512F: a shift left by 16 gives the even
 * weights of each 32-bit lane as float32, a mask of the low half the odd ones; the sums kept
 * by parity are put back in order once. The same FMAs over k in order: the same bits. */
AVX2 static void panel_avx2_bf16(const Job *j, int p) {
    const int K = j->K;
    const uint16_t *w = (const uint16_t *)j->W + (size_t)p * K * PANEL;
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0,
           o3 = e0;
    for (int k = 0; k < K; k++, w += PANEL) {
        const __m256 xk = _mm256_broadcast_ss(j->x + k);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)w);
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + 16));
        const __m256i v2 = _mm256_loadu_si256((const __m256i *)(w + 32));
        const __m256i v3 = _mm256_loadu_si256((const __m256i *)(w + 48));
        e0 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), e0);
        o0 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_and_si256(v0, high)), o0);
        e1 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), e1);
        o1 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_and_si256(v1, high)), o1);
        e2 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_slli_epi32(v2, 16)), e2);
        o2 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_and_si256(v2, high)), o2);
        e3 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_slli_epi32(v3, 16)), e3);
        o3 = _mm256_fmadd_ps(xk, _mm256_castsi256_ps(_mm256_and_si256(v3, high)), o3);
    }
    const __m256 even[4] = {e0, e1, e2, e3}, odd[4] = {o0, o1, o2, o3};
    float acc[PANEL];
    for (int i = 0; i < 4; i++) { /* lanes [0..3 | 8..11] and [4..7 | 12..15] of 16 outputs */
        const __m256 lo = _mm256_unpacklo_ps(even[i], odd[i]);
        const __m256 hi = _mm256_unpackhi_ps(even[i], odd[i]);
        _mm256_storeu_ps(acc + 16 * i, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(acc + 16 * i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
    panel_out(j, p, 0, acc, 0, PANEL);
}

AVX2 static void panels_avx2(const Job *j, int p, int q0, int q1) {
    if (q0 == 0 && q1 == PANEL / SLICE)
        j->bf16 ? panel_avx2_bf16(j, p) : panel_avx2_f32(j, p);
    else
        j->bf16 ? slices_avx2_body(j, p, q0, q1, 1) : slices_avx2_body(j, p, q0, q1, 0);
}

/* W's elements i..i+16 as float32 (half: sixteen bf16 widened exactly). */
AVX512 static inline __attribute__((always_inline)) __m512 load16(const void *W, size_t i,
                                                                   const int half) {
    if (!half)
        return _mm512_loadu_ps((const float *)W + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)W + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Rows m0 ≤ m < m0 + R (R ≤ ROW_BLOCK) of panels_plain for the Q slices q0 ≤ q < q0 + Q of
 * panel p: R × Q sums of 16 in registers, each 16Q weights of a k read once for the R rows
 * (half: W bfloat16, widened as read). A pass of the first R rows reads the panel from
 * memory, at the memory's pace where R is small; six rows keep the FMAs busy meanwhile, and
 * the next pass finds the panel in the cache. */
AVX512 static inline __attribute__((always_inline)) void
panel_rows_avx512(const Job *j, int p, int m0, const int R, const int half, int q0, const int Q) {
    const int K = j->K;
    size_t w = (size_t)p * K * PANEL + (size_t)q0 * SLICE;
    const float *x = j->x + (size_t)m0 * K;
    __m512 a[ROW_BLOCK][4];
    for (int r = 0; r < ROW_BLOCK; r++)
        for (int i = 0; i < 4; i++)
            a[r][i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++, w += PANEL) {
        __m512 b[4];
        for (int i = 0; i < Q; i++)
            b[i] = load16(j->W, w + 16 * (size_t)i, half);
        for (int r = 0; r < R; r++) {
            const __m512 s = _mm512_set1_ps(x[(size_t)r * K + k]);
            for (int i = 0; i < Q; i++)
                a[r][i] = _mm512_fmadd_ps(s, b[i], a[r][i]);
        }
    }
    for (int r = 0; r < R; r++) {
        float acc[PANEL];
        for (int i = 0; i < Q; i++)
            _mm512_storeu_ps(acc + SLICE * (q0 + i), a[r][i]);
        panel_out(j, p, m0 + r, acc, q0 * SLICE, (q0 + Q) * SLICE);
    }
}

/* panels_plain for up to PANEL_ROWS_MAX rows of x, ROW_BLOCK at a time, Q slices from q0
 * (constant in each call below). */
AVX512 static inline __attribute__((always_inline)) void
panel_avx512_body(const Job *j, int p, int q0, const int Q, const int half) {
    for (int m0 = 0; m0 < j->M; m0 += ROW_BLOCK) {
        switch (j->M - m0 < ROW_BLOCK ? j->M - m0 : ROW_BLOCK) {
        case 6: panel_rows_avx512(j, p, m0, 6, half, q0, Q); break;
        case 5: panel_rows_avx512(j, p, m0, 5, half, q0, Q); break;
        case 4: panel_rows_avx512(j, p, m0, 4, half, q0, Q); break;
        case 3: panel_rows_avx512(j, p, m0, 3, half, q0, Q); break;
        case 2: panel_rows_avx512(j, p, m0, 2, half, q0, Q); break;
        default: panel_rows_avx512(j, p, m0, 1, half, q0, Q); break;
        }
    }
}

AVX512 static void panel_avx512_f32(const Job *j, int p, int q0, int q1) {
    switch (q1 - q0) {
    case 4: panel_avx512_body(j, p, 0, 4, 0); break;
    case 3: panel_avx512_body(j, p, q0, 3, 0); break;
    case 2: panel_avx512_body(j, p, q0, 2, 0); break;
    default: panel_avx512_body(j, p, q0, 1, 0); break;
    }
}

/* Rows m0 ≤ m < m0 + R (R ≤ ROW_BLOCK) of panels_plain for the Q = 2 or 4 slices from q0 of
 * a bf16 panel p, widened two slices (32 weights, one 64-byte load) at a time in two operations:
 * each 32-bit lane holds weights 2i (low half) and 2i + 1 (high half), so a shift left by
 * 16 gives the even weights as float32 and masking the low half gives the odd ones, where
 * load16 takes a zero-extend and a shift for every 16. The sums are kept by parity (even
 * outputs in one register, odd in another) and put back in order once, at the end: each
 * output's sum is the same fused multiply-adds over k in order, so the same bits. At
 * SmolLM2's shapes the widening, not the memory, bounded load16's products (27 G weights/s
 * a core from L2, against 31 GB/s a core from memory: the two do not fully overlap). */
AVX512 static inline __attribute__((always_inline)) void
pairs_rows_bf16(const Job *j, int p, int m0, const int R, int q0, const int Q) {
    const int K = j->K, H = Q / 2;
    const uint16_t *w = (const uint16_t *)j->W + (size_t)p * K * PANEL + (size_t)q0 * SLICE;
    const float *x = j->x + (size_t)m0 * K;
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    __m512 even[ROW_BLOCK][2], odd[ROW_BLOCK][2];
    for (int r = 0; r < ROW_BLOCK; r++)
        for (int i = 0; i < 2; i++)
            even[r][i] = odd[r][i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++, w += PANEL) {
        __m512 we[2], wo[2];
        for (int i = 0; i < H; i++) {
            const __m512i v = _mm512_loadu_si512((const void *)(w + 32 * i));
            we[i] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            wo[i] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        }
        for (int r = 0; r < R; r++) {
            const __m512 s = _mm512_set1_ps(x[(size_t)r * K + k]);
            for (int i = 0; i < H; i++) {
                even[r][i] = _mm512_fmadd_ps(s, we[i], even[r][i]);
                odd[r][i] = _mm512_fmadd_ps(s, wo[i], odd[r][i]);
            }
        }
    }
    /* outputs 2i and 2i + 1 of a pair from lane i of even and odd */
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int r = 0; r < R; r++) {
        float acc[PANEL];
        for (int i = 0; i < H; i++) {
            float *out = acc + SLICE * (q0 + 2 * i);
            _mm512_storeu_ps(out, _mm512_permutex2var_ps(even[r][i], lo, odd[r][i]));
            _mm512_storeu_ps(out + SLICE, _mm512_permutex2var_ps(even[r][i], hi, odd[r][i]));
        }
        panel_out(j, p, m0 + r, acc, q0 * SLICE, (q0 + Q) * SLICE);
    }
}

/* pairs_rows_bf16 for every row of x, ROW_BLOCK at a time. */
AVX512 static inline __attribute__((always_inline)) void
pairs_bf16(const Job *j, int p, int q0, const int Q) {
    for (int m0 = 0; m0 < j->M; m0 += ROW_BLOCK) {
        switch (j->M - m0 < ROW_BLOCK ? j->M - m0 : ROW_BLOCK) {
        case 6: pairs_rows_bf16(j, p, m0, 6, q0, Q); break;
        case 5: pairs_rows_bf16(j, p, m0, 5, q0, Q); break;
        case 4: pairs_rows_bf16(j, p, m0, 4, q0, Q); break;
        case 3: pairs_rows_bf16(j, p, m0, 3, q0, Q); break;
        case 2: pairs_rows_bf16(j, p, m0, 2, q0, Q); break;
        default: pairs_rows_bf16(j, p, m0, 1, q0, Q); break;
        }
    }
}

/* The slices q0 ≤ q < q1 of a bf16 panel: pairs of slices widened by pairs_bf16, an odd
 * one left (a part's first or last panel, shared with the next or previous part) by
 * load16. */
AVX512 static void panel_avx512_bf16(const Job *j, int p, int q0, int q1) {
    switch (q1 - q0) {
    case 4: pairs_bf16(j, p, 0, 4); break;
    case 3: pairs_bf16(j, p, q0, 2), panel_avx512_body(j, p, q0 + 2, 1, 1); break;
    case 2: pairs_bf16(j, p, q0, 2); break;
    default: panel_avx512_body(j, p, q0, 1, 1); break;
    }
}

AVX512 static void panels_avx512(const Job *j, int p, int q0, int q1) {
    if (j->bf16)
        panel_avx512_bf16(j, p, q0, q1);
    else
        panel_avx512_f32(j, p, q0, q1);
}

#endif

static int use_avx2 = -1, use_avx512 = -1;
static const char *KERNEL_NAME = "portable";

static void pick_kernels(int portable) {
    use_avx2 = !portable && cpu_has_avx2();
    use_avx512 = !portable && cpu_has_avx512();
    KERNEL_NAME = use_avx2 ? "avx2" : "portable";
}

#include "_module.h" /* ints(), use_portable(), kernel_name() */
#include "_program.h" /* KernelEntry, run_entry(), export_impls() */

/* Part p of the rows form: rows of W in a contiguous band, into y (part 0, with the bias)
 * or into its own [M, N] of partial sums (the caller adds them up). */
static void rows_part(const void *job, int part, int parts) {
    const Job *j = job;
    int k0, k1;
    share(j->K, 4, part, parts, &k0, &k1);
    float *out = part == 0 ? j->y : j->partial + (size_t)(part - 1) * j->M * j->N;
    const float *bias = part == 0 ? j->b : NULL;
#if GG_X86
    if (use_avx2) {
        (j->bf16 ? rows_avx2_bf16 : rows_avx2)(j, out, bias, k0, k1);
        return;
    }
#endif
    rows_plain(j, out, bias, k0, k1);
}

/* The slices s0 ≤ s < s1 (16 outputs each) of the panels form into y. */
static void run_slices(const Job *j, int s0, int s1) {
    const int per = PANEL / SLICE;
    while (s0 < s1) {
        const int p = s0 / per, q0 = s0 % per, q1 = s1 - p * per < per ? s1 - p * per : per;
#if GG_X86
        if (use_avx512)
            panels_avx512(j, p, q0, q1);
        else if (use_avx2 && j->M == 1)
            panels_avx2(j, p, q0, q1);
        else
            panels_plain(j, p, q0, q1);
#else
        panels_plain(j, p, q0, q1);
#endif
        s0 = p * per + q1;
    }
}

/* Part p of the panels form: a contiguous run of slices (16 outputs each) into its own
 * outputs of y, so that the parts are even to a slice (SmolLM2's 576 outputs are 9 panels:
 * 5 and 4 whole panels a part would leave one thread idle a ninth of the time). A panel
 * shared by two parts is read in two halves of each row; every output's sum is the same
 * whichever part computes it. */
static void panels_part(const void *job, int part, int parts) {
    const Job *j = job;
    int s0, s1;
    share((j->N + SLICE - 1) / SLICE, 1, part, parts, &s0, &s1);
    run_slices(j, s0, s1);
}

/* A product and what a decoding step does next with its output, in one parallel run: each
 * part finishes its own outputs while they are in its cache (no second run, no Python call
 * between). The same operations on the same values as the separate calls, so the same bits:
 *   ADD: y = x P + b, then out = r + y (_rowwise.add: the residual sum after W_O, W_out);
 *   GLU: a = x P_a + b_a and g = x P_g + b_g, then s = silu(g) (_rowwise.silu, SILU_AVX2 or
 *        not) and h = s ⊙ a (_rowwise.mul): SwiGLU's gate and value. */
enum { ADD = 1, GLU = 2 };

typedef struct {
    Job a, g; /* a: the product (ADD) or the value; g: the gate (GLU) */
    int kind, silu_avx2;
    const float *r; /* ADD */
    float *out, *s; /* out: ADD's sum, GLU's h; s: GLU's silu(g) */
} Fused;

static void fused_part(const void *job, int part, int parts) {
    const Fused *f = job;
    const int M = f->a.M, N = f->a.N;
    int s0, s1;
    share((N + SLICE - 1) / SLICE, 1, part, parts, &s0, &s1);
    run_slices(&f->a, s0, s1);
    if (f->kind == GLU)
        run_slices(&f->g, s0, s1);
    const int c0 = s0 * SLICE, c1 = s1 * SLICE < N ? s1 * SLICE : N;
    for (int m = 0; m < M && c0 < c1; m++) {
        const size_t i0 = (size_t)m * N + c0, n = (size_t)(c1 - c0);
        if (f->kind == ADD) {
            const float *r = f->r + i0, *y = f->a.y + i0;
            float *out = f->out + i0;
            for (size_t i = 0; i < n; i++)
                out[i] = r[i] + y[i];
        } else {
            float *s = f->s + i0, *h = f->out + i0;
            const float *a = f->a.y + i0;
#if GG_X86
            (f->silu_avx2 ? silu_avx2 : silu_portable)(f->g.y + i0, s, (long long)n);
#else
            silu_portable(f->g.y + i0, s, (long long)n);
#endif
            for (size_t i = 0; i < n; i++)
                h[i] = s[i] * a[i];
        }
    }
}

/* ------------------------------------------------------------------------- Python -- */

/* float32 → bf16, rounded to nearest, ties to even (NaN stays a quiet NaN), as PyTorch's
 * conversion does. */
static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Float32 copies of a bf16 call's x and b (io = 1), y narrowed back after the run. */
typedef struct {
    float *x, *b, *y;
} Widened;

static int widen_inputs(Job *job, Widened *w, const uint16_t *x, const uint16_t *b,
                        size_t xs, size_t ys) {
    w->x = PyMem_RawMalloc(sizeof(float) * (xs + ys + (size_t)job->N));
    if (!w->x)
        return 0;
    w->y = w->x + xs, w->b = b ? w->y + ys : NULL;
    for (size_t i = 0; i < xs; i++)
        w->x[i] = bf16_to_float(x[i]);
    for (int i = 0; b && i < job->N; i++)
        w->b[i] = bf16_to_float(b[i]);
    job->x = w->x, job->b = w->b, job->y = w->y;
    return 1;
}

/* gemv_rows(x, W, b, y, M, K, N, threads) with W float32 (bf16 = 0) or bfloat16 (bf16 = 1);
 * io = 1: x, b and y bfloat16 too (widened before, y narrowed after) */
static int rows_impl(const long long *a, KernelError *err, int bf16, int io) {
    const long long M = a[4], K = a[5], N = a[6];
    if (M < 1 || M > MAX_ROWS || K < 1 || N < 1 || K > INT32_MAX || N > INT32_MAX)
        return kernel_fail(err, KERR_VALUE,
                           "gemv: need 1 <= M <= %d, K, N >= 1; got %lld, %lld, %lld", MAX_ROWS,
                           M, K, N);
    int threads = a[7] < 1 ? 1 : a[7] > MAX_THREADS ? MAX_THREADS : (int)a[7];
    Job job = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[2],
               (const void *)(uintptr_t)a[1], (float *)(uintptr_t)a[3],
               (int)M, (int)K, (int)N, bf16, NULL};
    /* Small products are not worth a second thread's wake-up. */
    if ((int64_t)K * N < 32768 || K < 8 * threads)
        threads = 1;
    Widened wide = {NULL, NULL, NULL};
    uint16_t *y16 = (uint16_t *)(uintptr_t)a[3];
    if (io && !widen_inputs(&job, &wide, (const uint16_t *)(uintptr_t)a[0],
                            (const uint16_t *)(uintptr_t)a[2], (size_t)(M * K), (size_t)(M * N)))
        return kernel_fail(err, KERR_MEMORY, "out of memory");
    if (threads > 1) {
        job.partial = PyMem_RawMalloc(sizeof(float) * (size_t)(threads - 1) * M * N);
        if (!job.partial) {
            PyMem_RawFree(wide.x);
            return kernel_fail(err, KERR_MEMORY, "out of memory");
        }
    }
    run_parts(rows_part, &job, threads);
    size_t size = (size_t)M * N;
    if (job.partial) { /* y += each part's partial sums, in part order */
        for (int p = 0; p < threads - 1; p++) {
            const float *part = job.partial + p * size;
            for (size_t i = 0; i < size; i++)
                job.y[i] += part[i];
        }
    }
    for (size_t i = 0; io && i < size; i++)
        y16[i] = float_to_bf16(job.y[i]);
    PyMem_RawFree(job.partial);
    PyMem_RawFree(wide.x);
    return 0;
}

/* An implementation `name` that runs impl(a, err, half, io): the float32 and bf16 forms. */
#define PRODUCT_FORM(name, impl, half, io)                                          \
    static int name(const long long *a, const double *d, KernelError *e) {          \
        return impl(a, e, half, io);                                                \
    }
PRODUCT_FORM(rows_f32, rows_impl, 0, 0)
PRODUCT_FORM(rows_bf16, rows_impl, 1, 0)
PRODUCT_FORM(rows_bf16_io, rows_impl, 1, 1)

#define ROWS_USAGE "gemv: expected x, W, b, y, M, K, N, threads"
static const KernelEntry ROWS = {"gemv_rows", "iiiiiiii", rows_f32, 1, ROWS_USAGE};
static const KernelEntry ROWS_BF16 = {"gemv_rows_bf16", "iiiiiiii", rows_bf16, 1, ROWS_USAGE};
static const KernelEntry ROWS_BF16_IO = {"gemv_rows_bf16_io", "iiiiiiii", rows_bf16_io, 1, ROWS_USAGE};

FASTCALL_ENTRY(py_rows, ROWS)

FASTCALL_ENTRY(py_rows_bf16, ROWS_BF16)

FASTCALL_ENTRY(py_rows_bf16_io, ROWS_BF16_IO)

/* The most rows of x the panels form takes: PANEL_ROWS_MAX where AVX-512F holds six rows'
 * sums in registers, else one. */
static int panel_rows(void) { return use_avx512 ? PANEL_ROWS_MAX : 1; }

/* The threads a panels run of K × N takes: none past the slices, one for a small product. */
static int panel_threads(long long threads, long long K, long long N) {
    const long long slices = (N + SLICE - 1) / SLICE;
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (K * N < 32768) /* not worth a second thread's wake-up */
        threads = 1;
    return (int)(threads > slices ? slices : threads);
}

/* gemv_panels(x, P, b, y, M, K, N, threads): y [M, N] = x [M, K] W + b, W in panels P;
 * half: P bfloat16; io: x, b and y bfloat16 too (x and b widened before, y rounded to
 * nearest after), else float32. */
static int panels_impl(const long long *a, KernelError *err, int half, int io) {
    const long long M = a[4], K = a[5], N = a[6];
    if (M < 1 || M > panel_rows() || K < 1 || N < 1 || K > INT32_MAX || N > INT32_MAX - PANEL)
        return kernel_fail(err, KERR_VALUE,
                           "gemv_panels: need 1 <= M <= %d, K, N >= 1; got %lld, %lld, %lld",
                           panel_rows(), M, K, N);
    Job job = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[2],
               (const void *)(uintptr_t)a[1], (float *)(uintptr_t)a[3], (int)M, (int)K, (int)N,
               half, NULL};
    const int threads = panel_threads(a[7], K, N);
    Widened wide = {NULL, NULL, NULL};
    uint16_t *y16 = (uint16_t *)(uintptr_t)a[3];
    if (io && !widen_inputs(&job, &wide, (const uint16_t *)(uintptr_t)a[0],
                              (const uint16_t *)(uintptr_t)a[2], (size_t)(M * K),
                              (size_t)(M * N)))
        return kernel_fail(err, KERR_MEMORY, "out of memory");
    run_parts(panels_part, &job, threads);
    for (size_t i = 0; io && i < (size_t)(M * N); i++)
        y16[i] = float_to_bf16(job.y[i]);
    PyMem_RawFree(wide.x);
    return 0;
}

PRODUCT_FORM(panels_f32, panels_impl, 0, 0)
PRODUCT_FORM(panels_bf16, panels_impl, 1, 0)
PRODUCT_FORM(panels_bf16_io, panels_impl, 1, 1)

#define PANELS_USAGE "expected gemv_panels(x, P, b, y, M, K, N, threads)"
static const KernelEntry PANELS = {"gemv_panels", "iiiiiiii", panels_f32, 1, PANELS_USAGE};
static const KernelEntry PANELS_BF16 = {"gemv_panels_bf16", "iiiiiiii", panels_bf16, 1, PANELS_USAGE};
static const KernelEntry PANELS_BF16_IO = {"gemv_panels_bf16_io", "iiiiiiii", panels_bf16_io, 1,
                                           PANELS_USAGE};

FASTCALL_ENTRY(py_panels, PANELS)

FASTCALL_ENTRY(py_panels_bf16, PANELS_BF16)

FASTCALL_ENTRY(py_panels_bf16_io, PANELS_BF16_IO)

static int fused_sizes(long long M, long long K, long long N, const char *name, KernelError *err) {
    if (M < 1 || M > panel_rows() || K < 1 || N < 1 || K > INT32_MAX || N > INT32_MAX - PANEL)
        return kernel_fail(err, KERR_VALUE,
                           "%s: need 1 <= M <= %d, K, N >= 1; got %lld, %lld, %lld", name,
                           panel_rows(), M, K, N) + 1;
    return 1;
}

/* gemv_panels_add(x, P, b, y, M, K, N, threads, half, r, out): y = x P + b (P float32, or
 * bfloat16 where half; x, b, y float32), then out = r + y, in one run (Fused's ADD). */
static int panels_add_impl(const long long *a, const double *unused, KernelError *err) {
    if (!fused_sizes(a[4], a[5], a[6], "gemv_panels_add", err))
        return -1;
    Fused f = {{(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[2],
                (const void *)(uintptr_t)a[1], (float *)(uintptr_t)a[3], (int)a[4], (int)a[5],
                (int)a[6], a[8] != 0, NULL}};
    f.kind = ADD, f.r = (const float *)(uintptr_t)a[9], f.out = (float *)(uintptr_t)a[10];
    run_parts(fused_part, &f, panel_threads(a[7], a[5], a[6]));
    return 0;
}

static const KernelEntry PANELS_ADD = {
    "gemv_panels_add", "iiiiiiiiiii", panels_add_impl, 1,
    "expected gemv_panels_add(x, P, b, y, M, K, N, threads, half, r, out)"};

FASTCALL_ENTRY(py_panels_add, PANELS_ADD)

/* gemv_panels_glu(x, Pa, ba, a, Pg, bg, g, M, K, N, threads, half, s, h, silu_avx2):
 * a = x Pa + ba, g = x Pg + bg, s = silu(g), h = s ⊙ a, in one run (Fused's GLU). */
static int panels_glu_impl(const long long *a, const double *unused, KernelError *err) {
    if (!fused_sizes(a[7], a[8], a[9], "gemv_panels_glu", err))
        return -1;
    const float *x = (const float *)(uintptr_t)a[0];
    const int M = (int)a[7], K = (int)a[8], N = (int)a[9], half = a[11] != 0;
    Fused f = {{x, (const float *)(uintptr_t)a[2], (const void *)(uintptr_t)a[1],
                (float *)(uintptr_t)a[3], M, K, N, half, NULL},
               {x, (const float *)(uintptr_t)a[5], (const void *)(uintptr_t)a[4],
                (float *)(uintptr_t)a[6], M, K, N, half, NULL}};
    f.kind = GLU, f.s = (float *)(uintptr_t)a[12], f.out = (float *)(uintptr_t)a[13];
    f.silu_avx2 = a[14] != 0 && use_avx2;
    run_parts(fused_part, &f, panel_threads(a[10], K, N));
    return 0;
}

static const KernelEntry PANELS_GLU = {
    "gemv_panels_glu", "iiiiiiiiiiiiiii", panels_glu_impl, 1,
    "expected gemv_panels_glu(x, Pa, ba, a, Pg, bg, g, M, K, N, threads, half, s, h, silu_avx2)"};

FASTCALL_ENTRY(py_panels_glu, PANELS_GLU)

/* The implementations a replayed step's program calls (kernels/_program.h). */
static const KernelEntry *const IMPLS[] = {&ROWS,        &ROWS_BF16,      &ROWS_BF16_IO,
                                           &PANELS,      &PANELS_BF16,    &PANELS_BF16_IO,
                                           &PANELS_ADD,  &PANELS_GLU,     NULL};

static PyObject *py_panel_rows(PyObject *self, PyObject *args) { return PyLong_FromLong(panel_rows()); }

static PyObject *py_has_avx2(PyObject *self, PyObject *args) { return PyBool_FromLong(use_avx2); }

/* wide_registers(flag): the AVX-512F panels where the CPU has them (True), or the AVX2 ones,
 * one row only (tests, on a CPU with both; no call may be in flight); returns whether the
 * AVX-512F panels are in use. */
static PyObject *py_wide_registers(PyObject *self, PyObject *flag) {
    const int on = PyObject_IsTrue(flag);
    if (on < 0)
        return NULL;
    use_avx512 = on && use_avx2 && cpu_has_avx512();
    return PyBool_FromLong(use_avx512);
}

static PyObject *py_solo_for(PyObject *self, PyObject *args) {
    long long ns;
    if (!PyArg_ParseTuple(args, "L", &ns))
        return NULL;
    Pacing *pacing = pacing_state();
    pacing->solo_until = clock_ns() + ns;
    pacing->gain = 0;
    pacing->retry = ns > 0; /* as a window the pacing began */
    Py_RETURN_NONE;
}

/* pace_run(start_ns, end_ns, own_ns, parts) -> whether the parts run one after another at
 * end_ns: one parallel run's times, on a clock of the caller's choosing, given to
 * _parallel.h's pacing as run_parts gives them (tests; solo_for(0) ends what they began). */
static PyObject *py_pace_run(PyObject *self, PyObject *args) {
    long long start, end, own;
    int parts;
    if (!PyArg_ParseTuple(args, "LLLi", &start, &end, &own, &parts))
        return NULL;
    pace(start, end, own, parts);
    return PyBool_FromLong(end < pacing_state()->solo_until);
}

static PyObject *py_pacing_counts(PyObject *self, PyObject *args) {
    const Pacing *pacing = pacing_state();
    return Py_BuildValue("LLL", (long long)pacing->parallel, (long long)pacing->solo,
                         (long long)pacing->windows);
}

#include "_greedy.h" /* greedy decoding's bounded argmax of x W_U */

static PyMethodDef methods[] = {
    GREEDY_METHODS
    {"gemv_rows", (PyCFunction)(void (*)(void))py_rows, METH_FASTCALL,
     "y[M, N] = x[M, K] W[K, N] (+ b): W row-major [K, N] float32"},
    {"gemv_rows_bf16", (PyCFunction)(void (*)(void))py_rows_bf16, METH_FASTCALL,
     "y[M, N] = x[M, K] W[K, N] (+ b): W row-major [K, N] bfloat16, x, b, y float32"},
    {"gemv_rows_bf16_io", (PyCFunction)(void (*)(void))py_rows_bf16_io, METH_FASTCALL,
     "y[M, N] = x[M, K] W[K, N] (+ b): W, x, b, y bfloat16, float32 sums, y rounded"},
    {"gemv_panels", (PyCFunction)(void (*)(void))py_panels, METH_FASTCALL,
     "y[M, N] = x[M, K] W[K, N] (+ b): W float32 in panels [ceil(N/64), K, 64]"},
    {"gemv_panels_bf16", (PyCFunction)(void (*)(void))py_panels_bf16, METH_FASTCALL,
     "gemv_panels with P bfloat16, x, b, y float32: bf16 weights, float32 activations"},
    {"gemv_panels_bf16_io", (PyCFunction)(void (*)(void))py_panels_bf16_io, METH_FASTCALL,
     "gemv_panels with P, x, b, y bfloat16: float32 sums, y rounded"},
    {"gemv_panels_add", (PyCFunction)(void (*)(void))py_panels_add, METH_FASTCALL,
     "gemv_panels_add(x, P, b, y, M, K, N, threads, half, r, out): y = x W + b, out = r + y"},
    {"gemv_panels_glu", (PyCFunction)(void (*)(void))py_panels_glu, METH_FASTCALL,
     "gemv_panels_glu(x, Pa, ba, a, Pg, bg, g, M, K, N, threads, half, s, h, silu_avx2): "
     "a = x Wa + ba, g = x Wg + bg, s = silu(g), h = s a"},
    {"panels_rows", py_panel_rows, METH_NOARGS, "the most rows of x gemv_panels takes"},
    {"has_avx2", py_has_avx2, METH_NOARGS, "whether the AVX2 + FMA kernels are in use"},
    {"wide_registers", py_wide_registers, METH_O,
     "wide_registers(flag): the AVX-512F panels where the CPU has them, or the AVX2 ones (tests)"},
    {"kernel", kernel_name, METH_NOARGS, "the kernels in use: 'avx2' or 'portable'"},
    {"use_portable", use_portable, METH_O, "use_portable(flag): force the portable loops (tests)"},
    {"solo_for", py_solo_for, METH_VARARGS,
     "solo_for(ns): run the parts one after another on the caller for the next ns (tests)"},
    {"pace_run", py_pace_run, METH_VARARGS,
     "pace_run(start_ns, end_ns, own_ns, parts): a parallel run's times to the pacing (tests)"},
    {"pacing_counts", py_pacing_counts, METH_NOARGS,
     "(parallel runs, runs one after another, solo windows begun) so far"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemv", NULL, -1, methods};

PyMODINIT_FUNC PyInit__gemv(void) {
    pick_kernels(0);
    return export_impls(PyModule_Create(&module), IMPLS);
}
