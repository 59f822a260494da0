/* Small-batch products for decoding: y = x W + b for M ≤ 32 rows of x, at memory bandwidth.
 *
 * At batch 1 a decoding step reads every weight once and does two flops per weight read,
 * so it costs the weight bytes over the memory bandwidth. This kernel streams each weight
 * once for all M rows, W [K, N] row-major, row by row:
 *
 *   y[m, :] = b + Σ_k x[m, k] · W[k, :]
 *
 * with float32 products and sums (AVX2 + FMA where the CPU has them, plain C otherwise).
 * The rows of W are split over PyTorch's own OpenMP threads (see run_parts), each streaming
 * one contiguous band of W into its own partial sums, which are added at the end.
 * The GIL is released while they run.
 *
 * Python API (pointers are addresses of contiguous float32 buffers; the caller checks
 * shapes, dtypes and contiguity):
 *   gemv_rows(x, W, b or 0, y, M, K, N, threads)
 *   has_avx2() -> bool
 *   solo_for(ns): the parts run one after another on the caller for the next ns
 *   (as after slow parallel runs, see _parallel.h; 0 ends it)
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_cpu.h"
#include "_parallel.h"

#define MAX_ROWS 32
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

/* rows form, rows k0 ≤ k < k1 of W, eight (or four) at a time: each thread streams one
 * contiguous band of W, and the M output rows stay in L1 or L2. The rows are taken a chunk
 * of columns at a time, small enough that the chunk's M rows of y and eight rows of W stay
 * in L1, so that with several rows of x each W value is read from L1 after the first. */
static int chunk_columns(int M) { return M <= 16 ? 256 : 128; }

AVX2 static void rows_avx2(const Job *j, float *out, const float *bias, int k0, int k1) {
    const int M = j->M, K = j->K, N = j->N, nv = N / 8 * 8, CHUNK = chunk_columns(M);
    for (int m = 0; m < M; m++) {
        if (bias)
            memcpy(out + (size_t)m * N, bias, sizeof(float) * N);
        else
            memset(out + (size_t)m * N, 0, sizeof(float) * N);
    }
    int k = k0;
    for (; k + 8 <= k1 && M > 1; k += 8) { /* eight rows of W at a time: y read once per 8 */
        const float *w = j->W + (size_t)k * N;
        for (int c = 0; c < nv; c += CHUNK) {
            const int c1 = c + CHUNK < nv ? c + CHUNK : nv;
            for (int m = 0; m < M; m++) {
                const float *x = j->x + (size_t)m * K + k;
                __m256 xs[8];
                for (int r = 0; r < 8; r++)
                    xs[r] = _mm256_set1_ps(x[r]);
                float *y = out + (size_t)m * N;
                for (int n = c; n < c1; n += 8) {
                    __m256 a = _mm256_loadu_ps(y + n);
                    __m256 b = _mm256_mul_ps(xs[1], _mm256_loadu_ps(w + N + n));
                    a = _mm256_fmadd_ps(xs[0], _mm256_loadu_ps(w + n), a);
                    a = _mm256_fmadd_ps(xs[2], _mm256_loadu_ps(w + 2 * N + n), a);
                    b = _mm256_fmadd_ps(xs[3], _mm256_loadu_ps(w + 3 * N + n), b);
                    a = _mm256_fmadd_ps(xs[4], _mm256_loadu_ps(w + 4 * N + n), a);
                    b = _mm256_fmadd_ps(xs[5], _mm256_loadu_ps(w + 5 * N + n), b);
                    a = _mm256_fmadd_ps(xs[6], _mm256_loadu_ps(w + 6 * N + n), a);
                    b = _mm256_fmadd_ps(xs[7], _mm256_loadu_ps(w + 7 * N + n), b);
                    _mm256_storeu_ps(y + n, _mm256_add_ps(a, b));
                }
            }
        }
        for (int m = 0; m < M; m++) {
            const float *x = j->x + (size_t)m * K + k;
            float *y = out + (size_t)m * N;
            for (int n = nv; n < N; n++)
                for (int r = 0; r < 8; r++)
                    y[n] += x[r] * w[(size_t)r * N + n];
        }
    }
    for (; k + 4 <= k1; k += 4) {
        const float *w0 = j->W + (size_t)k * N, *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
        for (int c = 0; c < nv; c += CHUNK) {
            const int c1 = c + CHUNK < nv ? c + CHUNK : nv;
            for (int m = 0; m < M; m++) {
                const float *x = j->x + (size_t)m * K + k;
                __m256 x0 = _mm256_set1_ps(x[0]), x1 = _mm256_set1_ps(x[1]);
                __m256 x2 = _mm256_set1_ps(x[2]), x3 = _mm256_set1_ps(x[3]);
                float *y = out + (size_t)m * N;
                for (int n = c; n < c1; n += 8) {
                    __m256 a = _mm256_loadu_ps(y + n);
                    a = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w0 + n), a);
                    a = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w1 + n), a);
                    a = _mm256_fmadd_ps(x2, _mm256_loadu_ps(w2 + n), a);
                    a = _mm256_fmadd_ps(x3, _mm256_loadu_ps(w3 + n), a);
                    _mm256_storeu_ps(y + n, a);
                }
            }
        }
        for (int m = 0; m < M; m++) {
            const float *x = j->x + (size_t)m * K + k;
            float *y = out + (size_t)m * N;
            for (int n = nv; n < N; n++)
                y[n] += x[0] * w0[n] + x[1] * w1[n] + x[2] * w2[n] + x[3] * w3[n];
        }
    }
    for (; k < k1; k++) {
        const float *w = j->W + (size_t)k * N;
        for (int m = 0; m < M; m++) {
            float xk = j->x[(size_t)m * K + k], *y = out + (size_t)m * N;
            __m256 xv = _mm256_set1_ps(xk);
            for (int n = 0; n < nv; n += 8)
                _mm256_storeu_ps(y + n, _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + n),
                                                        _mm256_loadu_ps(y + n)));
            for (int n = nv; n < N; n++)
                y[n] += xk * w[n];
        }
    }
}

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

static PyObject *py_solo_for(PyObject *self, PyObject *args) {
    long long ns;
    if (!PyArg_ParseTuple(args, "L", &ns))
        return NULL;
    pacing.solo_until = clock_ns() + ns;
    pacing.gain = 0;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gemv_rows", py_rows, METH_VARARGS, "y[M, N] = x[M, K] W[K, N] (+ b): W row-major [K, N]"},
    {"has_avx2", py_has_avx2, METH_NOARGS, "whether the AVX2 + FMA kernels are in use"},
    {"solo_for", py_solo_for, METH_VARARGS,
     "solo_for(ns): run the parts one after another on the caller for the next ns (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemv", NULL, -1, methods};

PyMODINIT_FUNC PyInit__gemv(void) {
    use_avx2 = cpu_has_avx2();
    return PyModule_Create(&module);
}
