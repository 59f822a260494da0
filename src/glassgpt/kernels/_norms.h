/* The norms of glassgpt's _rowwise extension, float32, forward and backward:
 *
 *   layer norm   y = (x − μ) · s ⊙ w + b,   μ = mean(x),  s = 1/√(mean((x − μ)²) + ε)
 *   RMS norm     y = x · s ⊙ w,             s = 1/√(mean(x²) + ε)
 *   backward     dx = s (ĝ − mean(ĝ) − x̂ mean(ĝ x̂)),  ĝ = g ⊙ w, x̂ = (x − μ) s
 *                (mean(ĝ) left out for RMS norm);  dw = Σ g ⊙ x̂,  db = Σ g over the rows
 *
 *   norm(x, w, b or 0, y, rows, d, eps, centred)   a decoding step's few rows, one thread;
 *                              centred: layer norm (1) or RMS norm (0)
 *   norm_train(x, w, b or 0, y, stats, rows, d, eps, centred, threads)   norm() of each row,
 *                              keeping μ (0 when not centred) and s per row in stats [rows, 2]
 *                              for the backward, rows in parts, the GIL released
 *   norm_train_backward(x, w, stats, g, dx, dw or 0, db or 0, rows, d, centred, threads)
 *                              dx, dw and db, summed in blocks of NORM_BLOCK rows and then
 *                              block by block: the same for any thread count
 *
 * Two passes a row (the mean, then the squares of x − μ), with AVX2 + FMA or as portable
 * loops, picked by pick_norms. Include once, from _rowwise.c (after _cpu.h, _parallel.h,
 * _module.h and part_count).
 */
#ifndef GLASSGPT_NORMS_H
#define GLASSGPT_NORMS_H

/* y = (x − μ) s w + b for one row of d values; stats (NULL: not kept) gets μ and s. */
typedef void (*NormFn)(const float *x, const float *w, const float *b, float *y, int d,
                       float eps, int centred, float *stats);

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

#if GG_X86
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
#endif

static NormFn NORM = norm_portable;
static NormBackFn NORM_BACK = norm_back_portable;

static void pick_norms(int avx2) {
    NORM = norm_portable, NORM_BACK = norm_back_portable;
#if GG_X86
    if (avx2)
        NORM = norm_avx2, NORM_BACK = norm_back_avx2;
#endif
}

static int norm_impl(const long long *a, const double *dv, KernelError *err) {
    if (a[4] < 0 || a[5] < 1 || a[5] > INT32_MAX)
        return kernel_fail(err, KERR_VALUE, "norm: need rows >= 0, d >= 1; got %lld, %lld", a[4],
                           a[5]);
    const float *x = (const float *)(uintptr_t)a[0], *w = (const float *)(uintptr_t)a[1];
    const float *b = (const float *)(uintptr_t)a[2];
    float *y = (float *)(uintptr_t)a[3];
    const int d = (int)a[5], centred = (int)a[6];
    for (long long r = 0; r < a[4]; r++)
        NORM(x + r * d, w, b, y + r * d, d, (float)dv[0], centred, NULL);
    return 0;
}

static const KernelEntry NORM_ENTRY = {"norm", "iiiiiidb", norm_impl, 0,
                                       "norm(x, w, b, y, rows, d, eps, centred)"};

FASTCALL_ENTRY(norm, NORM_ENTRY)

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

#endif
