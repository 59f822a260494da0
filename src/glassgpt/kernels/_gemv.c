/* Small-batch products for decoding: y = x W + b for M ≤ 8 rows of x, at memory bandwidth.
 *
 * At batch 1 a decoding step reads every weight once and does two flops per weight read,
 * so it costs the weight bytes over the memory bandwidth. This kernel streams each weight
 * once for all M rows, W [K, N] row-major, row by row:
 *
 *   y[m, :] = b + Σ_k x[m, k] · W[k, :]
 *
 * with float32 products and sums (AVX2 + FMA where the CPU has them, plain C otherwise).
 * For M > 1 the AVX2 kernel goes through W in chunks of 512 columns (whole rows up to 1,024
 * columns), four rows of W and two rows of x at a time, so that the chunk of y stays in L1
 * while all M rows pass over the same four rows of W (y of the unembedding, 8 × 50,257
 * floats, would not even fit in L2), prefetching the next four rows' chunk as it goes.
 * The rows of W are split over PyTorch's own OpenMP threads (see run_parts), each streaming
 * one contiguous band of W into its own partial sums, which are added at the end.
 * The GIL is released while they run.
 *
 * Python API (pointers are addresses of contiguous float32 buffers; the caller checks
 * shapes, dtypes and contiguity):
 *   gemv_rows(x, W, b or 0, y, M, K, N, threads)
 *   has_avx2() -> bool
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GG_X86 1
#else
#define GG_X86 0
#endif

#define MAX_ROWS 8
#define MAX_THREADS 256

typedef struct {
    const float *x, *W, *b;
    float *y;
    int M, K, N;
    float *partial; /* rows form: parts 1, 2, ... sum their rows of W into [M, N] each here */
} Job;


/* ------------------------------------------------------------------- plain C kernels -- */

/* rows form, rows k0 ≤ k < k1 of W: out[m, :] = bias + Σ_k x[m, k] · W[k, :] */
static void rows_plain(const Job *j, float *out, const float *bias, int k0, int k1) {
    const int M = j->M, K = j->K, N = j->N;
    for (int m = 0; m < M; m++) {
        float *y = out + (size_t)m * N;
        for (int n = 0; n < N; n++)
            y[n] = bias ? bias[n] : 0.0f;
        for (int k = k0; k < k1; k++) {
            const float *w = j->W + (size_t)k * N;
            float xk = j->x[(size_t)m * K + k];
            for (int n = 0; n < N; n++)
                y[n] += xk * w[n];
        }
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA kernels -- */
#if GG_X86
#define AVX2 __attribute__((target("avx2,fma")))

/* Columns n0 ≤ n < n1 (whole vectors) of four rows k .. k+3 of W for rows m, m+1 of x (two
 * when m2, else one): out[m.., n] += Σ x[m.., k] W[k, n], so each vector of W loaded serves
 * both rows of x; the same columns of rows pf0 ≤ r < pf1 of W are prefetched meanwhile. */
AVX2 static inline __attribute__((always_inline)) void four_avx2(
    const Job *j, float *out, int m, const int m2, int n0, int n1, int k, int pf0, int pf1) {
    const int K = j->K, N = j->N;
    const float *xa = j->x + (size_t)m * K + k, *xb = m2 ? xa + K : xa;
    float *ya = out + (size_t)m * N, *yb = m2 ? ya + N : ya;
    const float *w0 = j->W + (size_t)k * N, *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
    __m256 a0 = _mm256_set1_ps(xa[0]), a1 = _mm256_set1_ps(xa[1]);
    __m256 a2 = _mm256_set1_ps(xa[2]), a3 = _mm256_set1_ps(xa[3]);
    __m256 b0 = _mm256_set1_ps(xb[0]), b1 = _mm256_set1_ps(xb[1]);
    __m256 b2 = _mm256_set1_ps(xb[2]), b3 = _mm256_set1_ps(xb[3]);
    for (int n = n0; n < n1; n += 8) {
        if ((n & 15) == 0)
            for (int r = pf0; r < pf1; r++)
                _mm_prefetch((const char *)(j->W + (size_t)r * N + n), _MM_HINT_T0);
        __m256 v0 = _mm256_loadu_ps(w0 + n), v1 = _mm256_loadu_ps(w1 + n);
        __m256 v2 = _mm256_loadu_ps(w2 + n), v3 = _mm256_loadu_ps(w3 + n);
        __m256 ua = _mm256_loadu_ps(ya + n), ub = _mm256_loadu_ps(yb + n);
        ua = _mm256_fmadd_ps(a0, v0, ua), ub = _mm256_fmadd_ps(b0, v0, ub);
        ua = _mm256_fmadd_ps(a1, v1, ua), ub = _mm256_fmadd_ps(b1, v1, ub);
        ua = _mm256_fmadd_ps(a2, v2, ua), ub = _mm256_fmadd_ps(b2, v2, ub);
        ua = _mm256_fmadd_ps(a3, v3, ua), ub = _mm256_fmadd_ps(b3, v3, ub);
        _mm256_storeu_ps(ya + n, ua);
        if (m2)
            _mm256_storeu_ps(yb + n, ub);
    }
}

/* rows form, rows k0 ≤ k < k1 of W: each thread streams one contiguous band of W, in
 * chunks of CHUNK columns so that the chunk of the M output rows and of the four rows of W
 * at hand stay in L1 while every row of x passes over them. */
#define CHUNK 512
AVX2 static void rows_avx2(const Job *j, float *out, const float *bias, int k0, int k1) {
    const int M = j->M, K = j->K, N = j->N, nv = N / 8 * 8;
    for (int m = 0; m < M; m++) {
        if (bias)
            memcpy(out + (size_t)m * N, bias, sizeof(float) * N);
        else
            memset(out + (size_t)m * N, 0, sizeof(float) * N);
    }
    const int k4 = k0 + (k1 - k0) / 4 * 4;
    /* whole rows of W (streamed in order) for one row of x or up to 2 CHUNK columns */
    const int chunk = M == 1 || nv <= 2 * CHUNK ? nv : CHUNK;
    for (int n0 = 0; n0 < nv; n0 += chunk) {
        int n1 = n0 + chunk < nv ? n0 + chunk : nv;
        for (int k = k0; k < k4; k += 4) {
            /* prefetch rows k+4 .. k+7, a part of them in each pass over the rows of x */
            const int passes = (M + 1) / 2, ahead = k + 8 <= k4 ? 4 : 0;
            for (int m = 0, p = 0; m < M; m += 2, p++) {
                int pf0 = k + 4 + ahead * p / passes, pf1 = k + 4 + ahead * (p + 1) / passes;
                if (m + 1 < M)
                    four_avx2(j, out, m, 1, n0, n1, k, pf0, pf1);
                else
                    four_avx2(j, out, m, 0, n0, n1, k, pf0, pf1);
            }
        }
    }
    for (int m = 0; m < M; m++) { /* the last (k1 - k0) mod 4 rows, the last N mod 8 columns */
        const float *x = j->x + (size_t)m * K;
        float *y = out + (size_t)m * N;
        for (int k = k0; k < k1; k++)
            for (int n = k < k4 ? nv : 0; n < N; n++)
                y[n] += x[k] * j->W[(size_t)k * N + n];
    }
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
static int cpu_has_avx2(void) { return 0; }
#endif

static int use_avx2 = -1;

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
        rows_avx2(j, out, bias, k0, k1);
        return;
    }
#endif
    rows_plain(j, out, bias, k0, k1);
}

/* ------------------------------------------------------------------------- Python -- */

static PyObject *call(PyObject *args, PartFn fn) {
    unsigned long long x, W, b, y;
    int M, K, N, threads;
    if (!PyArg_ParseTuple(args, "KKKKiiii", &x, &W, &b, &y, &M, &K, &N, &threads))
        return NULL;
    if (M < 1 || M > MAX_ROWS || K < 1 || N < 1) {
        PyErr_Format(PyExc_ValueError, "gemv: need 1 <= M <= %d, K, N >= 1; got %d, %d, %d",
                     MAX_ROWS, M, K, N);
        return NULL;
    }
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    Job job = {(const float *)(uintptr_t)x, (const float *)(uintptr_t)W,
               (const float *)(uintptr_t)b, (float *)(uintptr_t)y, M, K, N, NULL};
    /* Small products are not worth a second thread's wake-up. */
    if ((int64_t)K * N < 32768 || K < 8 * threads)
        threads = 1;
    if (threads > 1) {
        job.partial = PyMem_RawMalloc(sizeof(float) * (size_t)(threads - 1) * M * N);
        if (!job.partial)
            return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    run_parts(fn, &job, threads);
    if (job.partial) { /* y += each part's partial sums, in part order */
        size_t size = (size_t)M * N;
        for (int p = 0; p < threads - 1; p++) {
            const float *part = job.partial + p * size;
            for (size_t i = 0; i < size; i++)
                job.y[i] += part[i];
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(job.partial);
    Py_RETURN_NONE;
}

static PyObject *py_rows(PyObject *self, PyObject *args) { return call(args, rows_part); }
static PyObject *py_has_avx2(PyObject *self, PyObject *args) { return PyBool_FromLong(use_avx2); }

static PyMethodDef methods[] = {
    {"gemv_rows", py_rows, METH_VARARGS, "y[M, N] = x[M, K] W[K, N] (+ b): W row-major [K, N]"},
    {"has_avx2", py_has_avx2, METH_NOARGS, "whether the AVX2 + FMA kernels are in use"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemv", NULL, -1, methods};

PyMODINIT_FUNC PyInit__gemv(void) {
    use_avx2 = cpu_has_avx2();
    return PyModule_Create(&module);
}
