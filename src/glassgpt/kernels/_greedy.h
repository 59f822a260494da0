/* Greedy decoding's pick argmax_v (x W_U + b)_v, exactly, reading W_U mostly as int8.
 *
 * A greedy step needs only the argmax of the logits, not the logits. Beside the float32
 * (bf16) panels P of W_U [K, N] (see the top of _gemv.c) greedy_pack keeps an int8 copy
 * Q [⌈N/64⌉, K, 64] in the same layout, with per vocabulary row v (column of W_U):
 *
 *   s_v = max_k |w_kv| / 127,  q_kv = round(w_kv / s_v),  e_v = w_v − s_v q_v,
 *   E2_v ≥ ‖e_v‖₂,  Einf_v ≥ max_k |e_kv|,  G_v ≥ γ (s_v ‖q_v‖₂ + ‖w_v‖₂),  γ = γ_{K+2}
 *
 * (computed in float64, rounded up; G_v = inf for a row holding a NaN or an inf). A step's
 * approximate logit A_v = s_v Σ_k x_k q_kv + b_v (float32 sums over int8 weights widened
 * exactly) is within
 *
 *   R_v = (min(‖x‖₂ E2_v, ‖x‖₁ Einf_v) + ‖x‖₂ G_v + 6u (|A_v| + |b_v|) + 2⁻⁶⁰)(1 + 2⁻¹⁶)
 *
 * of the float32 logit L_v that the panels compute: the first term bounds x·e_v (Cauchy-
 * Schwarz, Hölder), γ ‖x‖₂ s_v‖q_v‖₂ the rounding of the int8 sum and γ ‖x‖₂‖w_v‖₂ that of
 * the exact one (any order of K products: γ_K Σ|x_k w_k|, Higham §3.1), 6u(|A|+|b|) the
 * scaling and both bias adds, 2⁻⁶⁰ any underflow, the last factor the float32 arithmetic
 * of R itself. Every v with A_v + R_v below the best A_u − R_u has L_v < L_u: it is not
 * the argmax. The candidates left are recomputed by the panel kernel itself (run_slices,
 * on their whole panels: the same kernel, the same sums over k in order, so the same bits
 * as the full product's), and the first largest of their exact values is the pick, as
 * argmax_rows picks over the full logits. Where the candidates would cost more than
 * max_panels panels, x or an A_v is not finite, the full product is computed instead.
 *
 * The int8 pass reads a quarter of the float32 panels' bytes (half of bf16's), each
 * panel's 64 bytes a k widened to float32 sixteen (AVX-512F) or eight (AVX2) at a
 * time, or by a portable loop; greedy_variant forces one (tests). Python API:
 *   greedy_pack(P, half, K, N, Q, meta, threads)   Q int8 [⌈N/64⌉·K·64], meta float32 [4, ⌈N/64⌉·64]
 *   greedy_unembed(x, P, b or 0, y, M, K, N, threads, half, Q, meta, n_valid, out,
 *                  max_panels)   out int64 [M + 2]: each row's pick, then how (0: bounded,
 *                  1: the full product was computed into y, 2: as 1 with a NaN or an
 *                  infinite largest value: no pick), then the candidates counted
 *   greedy_variant(name or None) -> the int8 pass in use ("avx512", "avx2", "portable")
 * Include once, from _gemv.c, before its method table (after run_slices, panels_part,
 * panel_rows and panel_threads, which it calls).
 */
#ifndef GLASSGPT_GREEDY_H
#define GLASSGPT_GREEDY_H

#include <math.h>

#define G_U 5.9604644775390625e-08 /* 2^-24, float32's unit roundoff */

enum { G_PORTABLE = 0, G_AVX2 = 1, G_AVX512 = 2 };
static int greedy_pass = -1; /* the int8 pass in use: -1 until first asked */

static int greedy_best(void) {
#if GG_X86
    return cpu_has_avx512() ? G_AVX512 : cpu_has_avx2() ? G_AVX2 : G_PORTABLE;
#else
    return G_PORTABLE;
#endif
}

/* acc[c] = Σ_k x[k] q[k, c] over a panel's 64 columns, float32 sums of widened int8. */
static void int8_panel_portable(const float *x, const int8_t *q, int K, float *acc) {
    for (int c = 0; c < PANEL; c++)
        acc[c] = 0.0f;
    for (int k = 0; k < K; k++, q += PANEL)
        for (int c = 0; c < PANEL; c++)
            acc[c] += x[k] * (float)q[c];
}

#if GG_X86
AVX2 static inline __m256 widen8(const int8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

AVX2 static void int8_panel_avx2(const float *x, const int8_t *q, int K, float *acc) {
    __m256 a[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++, q += PANEL) {
        const __m256 xk = _mm256_broadcast_ss(x + k);
        for (int i = 0; i < 8; i++)
            a[i] = _mm256_fmadd_ps(xk, widen8(q + 8 * i), a[i]);
    }
    for (int i = 0; i < 8; i++)
        _mm256_storeu_ps(acc + 8 * i, a[i]);
}

AVX512 static inline __m512 widen16(const int8_t *q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

/* Two k a round into two sets of sums (eight chains of FMAs), added at the end: any order
 * of the K products is within the bound. */
AVX512 static void int8_panel_avx512(const float *x, const int8_t *q, int K, float *acc) {
    __m512 a[4], b[4];
    for (int i = 0; i < 4; i++)
        a[i] = b[i] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 2 <= K; k += 2, q += 2 * PANEL) {
        const __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
        for (int i = 0; i < 4; i++) {
            a[i] = _mm512_fmadd_ps(x0, widen16(q + 16 * i), a[i]);
            b[i] = _mm512_fmadd_ps(x1, widen16(q + PANEL + 16 * i), b[i]);
        }
    }
    if (k < K) {
        const __m512 x0 = _mm512_set1_ps(x[k]);
        for (int i = 0; i < 4; i++)
            a[i] = _mm512_fmadd_ps(x0, widen16(q + 16 * i), a[i]);
    }
    for (int i = 0; i < 4; i++)
        _mm512_storeu_ps(acc + 16 * i, _mm512_add_ps(a[i], b[i]));
}

/* int8_panel_avx512 for R ≤ ROW_BLOCK rows of x (K apart) at once: each k's 64 weights
 * widened once for the R rows (as the panels' AVX-512F rows kernel reads a weight once for
 * six rows), acc [R][64]. */
AVX512 static inline __attribute__((always_inline)) void
int8_rows_avx512_body(const float *x, const int8_t *q, int K, const int R, float *acc) {
    __m512 a[ROW_BLOCK][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++)
            a[r][i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++, q += PANEL) {
        const __m512 w0 = widen16(q), w1 = widen16(q + 16), w2 = widen16(q + 32),
                     w3 = widen16(q + 48);
        for (int r = 0; r < R; r++) {
            const __m512 xk = _mm512_set1_ps(x[(size_t)r * K + k]);
            a[r][0] = _mm512_fmadd_ps(xk, w0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(xk, w1, a[r][1]);
            a[r][2] = _mm512_fmadd_ps(xk, w2, a[r][2]);
            a[r][3] = _mm512_fmadd_ps(xk, w3, a[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++)
            _mm512_storeu_ps(acc + (size_t)r * PANEL + 16 * i, a[r][i]);
}

AVX512 static void int8_rows_avx512(const float *x, const int8_t *q, int K, int R, float *acc) {
    switch (R) {
    case 6: int8_rows_avx512_body(x, q, K, 6, acc); break;
    case 5: int8_rows_avx512_body(x, q, K, 5, acc); break;
    case 4: int8_rows_avx512_body(x, q, K, 4, acc); break;
    case 3: int8_rows_avx512_body(x, q, K, 3, acc); break;
    default: int8_rows_avx512_body(x, q, K, 2, acc); break;
    }
}
#endif

static void int8_panel(const float *x, const int8_t *q, int K, float *acc) {
#if GG_X86
    if (greedy_pass == G_AVX512)
        return int8_panel_avx512(x, q, K, acc);
    if (greedy_pass == G_AVX2)
        return int8_panel_avx2(x, q, K, acc);
#endif
    int8_panel_portable(x, q, K, acc);
}

/* acc [R][64] for rows m0 ≤ m < m0 + R of x [M, K] over panel q: the AVX-512F pass takes
 * up to ROW_BLOCK rows a read of the panel, the others one row at a time. */
static void int8_rows(const float *x, const int8_t *q, int K, int R, float *acc) {
#if GG_X86
    if (greedy_pass == G_AVX512 && R > 1)
        return int8_rows_avx512(x, q, K, R, acc);
#endif
    for (int r = 0; r < R; r++)
        int8_panel(x + (size_t)r * K, q, K, acc + (size_t)r * PANEL);
}

/* A float64 bound as the float32 at or above it. */
static float up(double v) {
    float f = (float)(v * (1.0 + 0x1p-20));
    return f < v ? nextafterf(f, INFINITY) : f;
}

/* greedy_pack's work on panel p: Q's panel, and meta's four rows at its 64 columns. */
static void pack_panel(const void *P, int half, int K, int N, int p, int8_t *Q, float *meta) {
    const size_t Np = (size_t)(N + PANEL - 1) / PANEL * PANEL, base = (size_t)p * K * PANEL;
    const double gamma = (K + 2) * G_U / (1.0 - (K + 2) * G_U);
    double big[PANEL] = {0}, ww[PANEL] = {0}, qq[PANEL] = {0}, ee[PANEL] = {0}, ei[PANEL] = {0};
    int bad[PANEL] = {0};
    float s[PANEL];
    for (int k = 0; k < K; k++)
        for (int c = 0; c < PANEL; c++) {
            const double w = weight(P, base + (size_t)k * PANEL + c, half);
            bad[c] |= !isfinite(w);
            big[c] = fabs(w) > big[c] ? fabs(w) : big[c];
            ww[c] += w * w;
        }
    for (int c = 0; c < PANEL; c++)
        s[c] = bad[c] ? 0.0f : (float)(big[c] / 127.0);
    for (int k = 0; k < K; k++)
        for (int c = 0; c < PANEL; c++) {
            const size_t i = base + (size_t)k * PANEL + c;
            const double w = weight(P, i, half);
            double r = s[c] > 0 ? nearbyint(w / s[c]) : 0.0;
            r = bad[c] ? 0.0 : r > 127 ? 127 : r < -127 ? -127 : r;
            Q[i] = (int8_t)r;
            const double e = bad[c] ? 0.0 : fabs(w - (double)s[c] * r); /* exact in float64 */
            qq[c] += r * r, ee[c] += e * e;
            ei[c] = e > ei[c] ? e : ei[c];
        }
    for (int c = 0; c < PANEL; c++) {
        const size_t v = (size_t)p * PANEL + c;
        meta[v] = s[c];
        meta[Np + v] = up(sqrt(ee[c]));
        meta[2 * Np + v] = up(ei[c]);
        meta[3 * Np + v] = bad[c] ? INFINITY : up(gamma * ((double)s[c] * sqrt(qq[c]) + sqrt(ww[c])));
    }
}

typedef struct {
    const void *P;
    int8_t *Q;
    float *meta;
    int half, K, N;
} Pack;

static void pack_part(const void *job, int part, int parts) {
    const Pack *k = job;
    int p0, p1;
    share((k->N + PANEL - 1) / PANEL, 1, part, parts, &p0, &p1);
    for (int p = p0; p < p1; p++)
        pack_panel(k->P, k->half, k->K, k->N, p, k->Q, k->meta);
}

typedef struct {
    const int8_t *Q;
    const float *meta, *x, *b;
    float *y; /* the upper bounds A_v + R_v, [M, N] */
    const double *x2, *x1; /* each row's ‖x‖₂ and ‖x‖₁, rounded up */
    int M, K, N, n_valid;
    float *lower; /* [parts, M]: each part's best lower bound A_v − R_v of each row */
    int *bad;     /* [parts]: an A_v not finite */
} Bounds;

static void bounds_part(const void *job, int part, int parts) {
    const Bounds *g = job;
    const int npan = (g->N + PANEL - 1) / PANEL;
    const size_t Np = (size_t)npan * PANEL;
    int p0, p1;
    share(npan, 1, part, parts, &p0, &p1);
    float *lower = g->lower + (size_t)part * g->M;
    for (int m = 0; m < g->M; m++)
        lower[m] = -INFINITY;
    g->bad[part] = 0;
    float block[ROW_BLOCK * PANEL];
    for (int p = p0; p < p1; p++) {
        const int n = g->n_valid - p * PANEL < PANEL ? g->n_valid - p * PANEL : PANEL;
        for (int m = 0; m < g->M; m++) {
            const int r = m % ROW_BLOCK;
            if (r == 0) /* the next rows' int8 sums, ROW_BLOCK a read of the panel */
                int8_rows(g->x + (size_t)m * g->K, g->Q + (size_t)p * g->K * PANEL, g->K,
                          g->M - m < ROW_BLOCK ? g->M - m : ROW_BLOCK, block);
            const float *acc = block + (size_t)r * PANEL;
            const float x2 = (float)g->x2[m], x1 = (float)g->x1[m];
            float *y = g->y + (size_t)m * g->N + (size_t)p * PANEL;
            float lo = lower[m];
            for (int c = 0; c < n; c++) {
                const size_t v = (size_t)p * PANEL + c;
                const float b = g->b ? g->b[v] : 0.0f;
                const float A = g->meta[v] * acc[c] + b;
                const float e2 = x2 * g->meta[Np + v], ei = x1 * g->meta[2 * Np + v];
                float R = ((e2 < ei ? e2 : ei) + x2 * g->meta[3 * Np + v] +
                           (float)(6 * G_U) * (fabsf(A) + fabsf(b)) + 0x1p-60f) *
                          (1.0f + 0x1p-16f);
                if (!(R <= INFINITY)) /* NaN (0 · inf): no bound */
                    R = INFINITY;
                if (!(fabsf(A) < 1e30f))
                    g->bad[part] = 1;
                y[c] = A + R;
                lo = A - R > lo ? A - R : lo;
            }
            lower[m] = lo;
        }
    }
}

typedef struct {
    const Job *job;
    const int *panels;
    int count;
} Redo;

/* The panels listed, each in full (every row), by the product's own kernel. */
static void redo_part(const void *job, int part, int parts) {
    const Redo *r = job;
    const int slices = (r->job->N + SLICE - 1) / SLICE, per = PANEL / SLICE;
    int i0, i1;
    share(r->count, 1, part, parts, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        const int p = r->panels[i];
        run_slices(r->job, p * per, (p + 1) * per < slices ? (p + 1) * per : slices);
    }
}

/* Each row's first largest of the first n values of y (status 2 where a row holds a NaN or
 * an infinite largest: argmax_rows's None). */
static long long full_argmax(const Job *j, int n, long long *out) {
    for (int m = 0; m < j->M; m++) {
        const float *z = j->y + (size_t)m * j->N;
        float best = z[0];
        long long at = 0;
        int nan = 0;
        for (int v = 0; v < n; v++) {
            nan |= z[v] != z[v];
            if (z[v] > best)
                best = z[v], at = v;
        }
        if (nan || !isfinite(best))
            return 2;
        out[m] = at;
    }
    return 1;
}

static PyObject *py_greedy_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[7];
    if (!int_args(args, nargs, 7, a, "greedy_pack(P, half, K, N, Q, meta, threads)"))
        return NULL;
    if (a[2] < 1 || a[3] < 1 || a[2] > INT32_MAX || a[3] > INT32_MAX - PANEL) {
        PyErr_SetString(PyExc_ValueError, "greedy_pack: need K, N >= 1");
        return NULL;
    }
    Pack job = {(const void *)(uintptr_t)a[0], (int8_t *)(uintptr_t)a[4],
                (float *)(uintptr_t)a[5], a[1] != 0, (int)a[2], (int)a[3]};
    Py_BEGIN_ALLOW_THREADS
    run_parts(pack_part, &job, a[6] < 1 ? 1 : a[6] > MAX_THREADS ? MAX_THREADS : (int)a[6]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* The body of greedy_unembed, without the GIL: out[0..M) the picks, the status returned. */
static long long greedy_run(const Job *j, int threads, const int8_t *Q, const float *meta,
                            int n_valid, int max_panels, long long *count) {
    const int M = j->M, K = j->K, N = j->N, npan = (N + PANEL - 1) / PANEL;
    long long *out = count - M - 1;
    double x2[MAX_ROWS], x1[MAX_ROWS];
    int finite = 1;
    for (int m = 0; m < M; m++) {
        double s2 = 0, s1 = 0;
        for (int k = 0; k < K; k++) {
            const double v = j->x[(size_t)m * K + k];
            s2 += v * v, s1 += fabs(v);
        }
        x2[m] = sqrt(s2) * (1.0 + 0x1p-20), x1[m] = s1 * (1.0 + 0x1p-20);
        finite &= isfinite(x2[m]) && x2[m] < 1e30;
    }
    *count = 0;
    int parts = panel_threads(threads, K, N);
    float *lower = malloc(sizeof(float) * (size_t)parts * M + sizeof(int) * (size_t)parts);
    int *marks = calloc((size_t)npan, sizeof(int)), *panels = malloc(sizeof(int) * npan);
    int cap = 64 * max_panels + PANEL, *cand = malloc(sizeof(int) * (size_t)cap * M);
    int *counts = calloc((size_t)M, sizeof(int));
    long long status = 1;
    if (!lower || !marks || !panels || !cand || !counts || !finite)
        goto full;
    Bounds g = {Q, meta, j->x, j->b, j->y, x2, x1, M, K, N, n_valid, lower,
                (int *)(lower + (size_t)parts * M)};
    run_parts(bounds_part, &g, parts);
    int used = 0;
    for (int part = 0; part < parts; part++)
        if (g.bad[part])
            goto full;
    for (int m = 0; m < M; m++) {
        float best = -INFINITY;
        for (int part = 0; part < parts; part++)
            best = lower[(size_t)part * M + m] > best ? lower[(size_t)part * M + m] : best;
        if (!(best > -INFINITY))
            goto full;
        const float *u = j->y + (size_t)m * N;
        int *c = cand + (size_t)m * cap;
        for (int v = 0; v < n_valid; v++) {
            if (!(u[v] >= best))
                continue;
            if (counts[m] == cap)
                goto full;
            c[counts[m]++] = v;
            if (!marks[v / PANEL]++) {
                if (used == max_panels)
                    goto full;
                panels[used++] = v / PANEL;
            }
        }
        *count += counts[m];
    }
    Redo redo = {j, panels, used};
    run_parts(redo_part, &redo, used < parts ? used : parts);
    for (int m = 0; m < M; m++) {
        const float *z = j->y + (size_t)m * N;
        const int *c = cand + (size_t)m * cap;
        float top = z[c[0]];
        long long at = c[0];
        for (int i = 0; i < counts[m]; i++) {
            if (z[c[i]] != z[c[i]])
                top = NAN;
            if (z[c[i]] > top)
                top = z[c[i]], at = c[i];
        }
        if (!isfinite(top)) { /* a NaN or an infinite largest: the caller's path */
            status = 2;
            break;
        }
        out[m] = at;
        status = 0;
    }
    if (status == 2)
        goto full;
    goto done;
full:
    run_parts(panels_part, j, parts);
    status = full_argmax(j, n_valid, out);
done:
    free(lower), free(marks), free(panels), free(cand), free(counts);
    return status;
}

static PyObject *py_greedy_unembed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[14];
    if (!int_args(args, nargs, 14, a,
                  "greedy_unembed(x, P, b, y, M, K, N, threads, half, Q, meta, n_valid, out, "
                  "max_panels)"))
        return NULL;
    const long long M = a[4], K = a[5], N = a[6], n_valid = a[11];
    if (M < 1 || M > panel_rows() || K < 1 || N < 1 || K > INT32_MAX || N > INT32_MAX - PANEL ||
        n_valid < 1 || n_valid > N || a[13] < 1) {
        PyErr_Format(PyExc_ValueError,
                     "greedy_unembed: need 1 <= M <= %d, K, N >= 1, 1 <= n_valid <= N, "
                     "max_panels >= 1",
                     panel_rows());
        return NULL;
    }
    if (greedy_pass < 0)
        greedy_pass = greedy_best();
    Job job = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[2],
               (const void *)(uintptr_t)a[1], (float *)(uintptr_t)a[3], (int)M, (int)K, (int)N,
               a[8] != 0, NULL};
    long long *out = (long long *)(uintptr_t)a[12];
    Py_BEGIN_ALLOW_THREADS
    out[M] = greedy_run(&job, (int)(a[7] > MAX_THREADS ? MAX_THREADS : a[7]),
                        (const int8_t *)(uintptr_t)a[9], (const float *)(uintptr_t)a[10],
                        (int)n_valid, (int)(a[13] > INT32_MAX / 128 ? INT32_MAX / 128 : a[13]),
                        out + M + 1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static const char *GREEDY_NAMES[] = {"portable", "avx2", "avx512"};

/* greedy_variant(name or None): force the int8 pass (tests; None: the best this CPU runs). */
static PyObject *py_greedy_variant(PyObject *self, PyObject *name) {
    const int best = greedy_best();
    if (name == Py_None) {
        greedy_pass = best;
    } else {
        const char *s = PyUnicode_AsUTF8(name);
        if (!s)
            return NULL;
        int want = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(s, GREEDY_NAMES[i]))
                want = i;
        if (want < 0 || want > best) {
            PyErr_Format(PyExc_ValueError, "greedy_variant: %s is not one this CPU runs", s);
            return NULL;
        }
        greedy_pass = want;
    }
    return PyUnicode_FromString(GREEDY_NAMES[greedy_pass]);
}

#define GREEDY_METHODS                                                                        \
    {"greedy_pack", (PyCFunction)(void (*)(void))py_greedy_pack, METH_FASTCALL,               \
     "greedy_pack(P, half, K, N, Q, meta, threads): W_U's int8 copy and its error bounds"},            \
        {"greedy_unembed", (PyCFunction)(void (*)(void))py_greedy_unembed, METH_FASTCALL,     \
         "greedy_unembed(x, P, b, y, M, K, N, threads, half, Q, meta, n_valid, out, "         \
         "max_panels): each row's exact argmax of x W + b, reading W mostly as int8"},        \
        {"greedy_variant", py_greedy_variant, METH_O,                                          \
         "greedy_variant(name or None): force the int8 pass (tests)"},

#endif
