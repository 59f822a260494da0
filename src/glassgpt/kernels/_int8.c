/* The int8 weight-only product of glassgpt.kernels.int8, for a few rows of x (decoding).
 *
 *     y[m, j] = s[j] · Σ_i x[m, i] q[j, i] + b[j]        m < M, j < d_out, i < d_in
 *
 * x float32 [M, d_in], q int8 [d_out, d_in] (one output channel per contiguous row), s
 * float32 [d_out], b float32 [d_out] or none, y float32 [M, d_out]. Every product and sum is
 * float32, so y is x W̃ + b for W̃[i, j] = q[j, i] s[j] up to the summation order.
 *
 * At M ≤ 8 the product is bound by reading q: each weight row is read from memory once for
 * all M rows of x (several rows of q at a time, several accumulators each), converted 8 at a
 * time int8 → int32 → float32 and multiplied-added into float32 accumulators. The AVX2+FMA
 * kernel is chosen at run time (__builtin_cpu_supports); a portable loop does the rest.
 *
 * Threads: the output channels are split over PyTorch's own OpenMP threads (_parallel.h).
 * The GIL is released during the call.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define MAX_ROWS 8    /* rows of x per call (decoding batch) */
#define MAX_THREADS 256

typedef struct {
    const float *x;
    const int8_t *q;
    const float *s;
    const float *b; /* or NULL */
    float *y;
    Py_ssize_t M, d_in, d_out;
} Job;

typedef void (*Kernel)(const Job *, Py_ssize_t j0, Py_ssize_t j1);

/* ---- portable kernel ---------------------------------------------------------------- */

static void rows_scalar(const Job *J, Py_ssize_t j0, Py_ssize_t j1) {
    for (Py_ssize_t j = j0; j < j1; j++) {
        const int8_t *qj = J->q + j * J->d_in;
        for (Py_ssize_t m = 0; m < J->M; m++) {
            const float *xm = J->x + m * J->d_in;
            float acc = 0.0f;
            for (Py_ssize_t i = 0; i < J->d_in; i++) acc += xm[i] * (float)qj[i];
            J->y[m * J->d_out + j] = acc * J->s[j] + (J->b ? J->b[j] : 0.0f);
        }
    }
}

/* ---- AVX2 + FMA kernel ---------------------------------------------------------------- */
#if HAVE_X86
#define TARGET __attribute__((target("avx2,fma")))

TARGET static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

TARGET static inline __m256 load8(const int8_t *p) { /* 8 int8 → 8 float32 */
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* R rows of q (j .. j+R-1) against M rows of x (m0 .. m0+M-1): R·M float32 accumulators.
 * Called with constant R and M, so the loops over them unroll and the accumulators stay in
 * registers. */
TARGET static inline __attribute__((always_inline)) void block(
    const Job *J, Py_ssize_t j, Py_ssize_t m0, const int R, const int M) {
    const Py_ssize_t n = J->d_in, n8 = n & ~(Py_ssize_t)7;
    const float *x = J->x + m0 * n;
    const int8_t *q = J->q + j * n;
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int m = 0; m < M; m++) acc[r][m] = _mm256_setzero_ps();
#define STEP8(i)                                                                         \
    do {                                                                                 \
        __m256 w[4];                                                                     \
        for (int r = 0; r < R; r++) w[r] = load8(q + r * n + (i));                       \
        for (int m = 0; m < M; m++) {                                                    \
            __m256 xv = _mm256_loadu_ps(x + m * n + (i));                                \
            for (int r = 0; r < R; r++) acc[r][m] = _mm256_fmadd_ps(w[r], xv, acc[r][m]); \
        }                                                                                \
    } while (0)
    /* 64 bytes of each row per turn, prefetching the same bytes two groups of R rows on: the
     * hardware prefetcher alone streams int8 rows at a fraction of the bandwidth */
    const Py_ssize_t n64 = n & ~(Py_ssize_t)63;
    Py_ssize_t i = 0;
    for (; i < n64; i += 64) {
        for (int r = 0; r < R; r++) _mm_prefetch((const char *)(q + (2 * R + r) * n + i), _MM_HINT_T0);
        for (int u = 0; u < 64; u += 8) STEP8(i + u);
    }
    for (; i < n8; i += 8) STEP8(i);
#undef STEP8
    for (int r = 0; r < R; r++) {
        const float sj = J->s[j + r], bj = J->b ? J->b[j + r] : 0.0f;
        for (int m = 0; m < M; m++) {
            float t = hsum(acc[r][m]);
            for (Py_ssize_t i = n8; i < n; i++) t += x[m * n + i] * (float)q[r * n + i];
            J->y[(m0 + m) * J->d_out + j + r] = t * sj + bj;
        }
    }
}

/* rows j0 .. j1-1 for rows of x m0 .. m0+M-1, M ≤ 4: 4 (or 2) weight rows at a time */
#define ROWS(M_, R_)                                                              \
    TARGET static void rows_##M_(const Job *J, Py_ssize_t j0, Py_ssize_t j1, Py_ssize_t m0) { \
        Py_ssize_t j = j0;                                                        \
        for (; j + R_ <= j1; j += R_) block(J, j, m0, R_, M_);                    \
        for (; j < j1; j++) block(J, j, m0, 1, M_);                               \
    }
ROWS(1, 4)
ROWS(2, 4)
ROWS(3, 2)
ROWS(4, 2)

/* M ≤ 4: one pass. M 5..8: two passes of ≤ 4 rows over a chunk of weight rows small enough
 * to stay in cache, so the weights are read from memory once. */
TARGET static void rows_avx2(const Job *J, Py_ssize_t j0, Py_ssize_t j1) {
    static void (*const by_m[5])(const Job *, Py_ssize_t, Py_ssize_t, Py_ssize_t) = {
        NULL, rows_1, rows_2, rows_3, rows_4};
    if (J->M <= 4) {
        by_m[J->M](J, j0, j1, 0);
        return;
    }
    Py_ssize_t chunk = (16384 / (J->d_in ? J->d_in : 1)) & ~(Py_ssize_t)3;
    if (chunk < 4) chunk = 4;
    const Py_ssize_t first = (J->M + 1) / 2;
    for (Py_ssize_t a = j0; a < j1; a += chunk) {
        Py_ssize_t b = a + chunk < j1 ? a + chunk : j1;
        by_m[first](J, a, b, 0);
        by_m[J->M - first](J, a, b, first);
    }
}
#endif

static Kernel pick_kernel(const char **name) {
#if HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *name = "avx2";
        return rows_avx2;
    }
#endif
    *name = "scalar";
    return rows_scalar;
}

static Kernel KERNEL;
static const char *KERNEL_NAME;

/* ---- the threads ------------------------------------------------------------------ */

static void part(const void *job, int k, int parts) { /* rows of part k, in multiples of 4 */
    const Job *J = job;
    int j0, j1;
    share((int)J->d_out, 4, k, parts, &j0, &j1);
    if (j0 < j1) KERNEL(J, j0, j1);
}

static void run(const Job *J, int threads) {
    /* a part per thread, but none smaller than 64 KiB of weights (not worth a wake-up) */
    Py_ssize_t max_parts = J->d_out * J->d_in / 65536;
    if (threads > max_parts) threads = max_parts > 1 ? (int)max_parts : 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    run_parts(part, J, threads);
}

/* ---- Python ------------------------------------------------------------------------- */

static PyObject *gemv(PyObject *self, PyObject *args) {
    unsigned long long x, q, s, b, y;
    Py_ssize_t M, d_in, d_out;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKKnnni", &x, &q, &s, &b, &y, &M, &d_in, &d_out, &threads))
        return NULL;
    if (M < 1 || M > MAX_ROWS || d_in < 0 || d_out < 0 || !x || !q || !s || !y) {
        PyErr_SetString(PyExc_ValueError, "gemv: need 1 ≤ M ≤ 8, sizes ≥ 0 and non-null buffers");
        return NULL;
    }
    Job J = {(const float *)(uintptr_t)x, (const int8_t *)(uintptr_t)q, (const float *)(uintptr_t)s,
             (const float *)(uintptr_t)b, (float *)(uintptr_t)y, M, d_in, d_out};
    Py_BEGIN_ALLOW_THREADS run(&J, threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *use_portable(PyObject *self, PyObject *flag) { /* tests: the portable loop */
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    if (on) KERNEL = rows_scalar, KERNEL_NAME = "scalar"; /* tests only: no call may be in flight */
    else KERNEL = pick_kernel(&KERNEL_NAME);
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyMethodDef methods[] = {
    {"gemv", gemv, METH_VARARGS,
     "gemv(x, q, s, b, y, M, d_in, d_out, threads): y = (x qᵀ)·s + b; addresses as ints, b 0 "
     "for none (the GIL is released)"},
    {"kernel", kernel_name, METH_NOARGS, "the kernel in use: 'avx2' or 'scalar'"},
    {"use_portable", use_portable, METH_O, "use_portable(flag): force the portable loop (tests)"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int8",
                                    "The int8 weight-only product for a few rows.", -1, methods};

PyMODINIT_FUNC PyInit__int8(void) {
    KERNEL = pick_kernel(&KERNEL_NAME);
    return PyModule_Create(&module);
}
