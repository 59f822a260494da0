/* The int8 weight-only product of glassgpt.kernels.int8, for a few rows of x (decoding).
 *
 *     y[m, j] = s[j] · Σ_i x[m, i] q[j, i] + b[j]        m < M, j < d_out, i < d_in
 *
 * x float32 [M, d_in], s float32 [d_out], b float32 [d_out] or none, y float32 [M, d_out];
 * q int8 in panels of 8 output channels, p[d_out/8 (rounded up), d_in, 8] with
 * p[j/8, i, j%8] = q[j, i] (zeros past d_out): the 8 weights of a panel at input i are 8
 * contiguous bytes. Every product and sum is float32, so y is x W̃ + b for W̃[i, j] =
 * q[j, i] s[j] up to the summation order.
 *
 * At M ≤ 8 the product is bound by reading q (M = 1) or by its multiply-adds (M = 8 does 16
 * flops per weight byte): each panel is read once for all M rows of x; the 8 weights at input
 * i are converted int8 → int32 → float32 once and multiplied-added into one 8-wide float32
 * accumulator per row of x (x[m, i] broadcast), so a conversion serves M multiply-adds and
 * no horizontal sums are needed. Fewer rows take several panels at a time (up to 8
 * accumulators, enough to cover the multiply-add latency). x is transposed first (x[i, m],
 * M floats per input), so the broadcasts read it in order. The AVX2+FMA kernel is chosen at
 * run time (__builtin_cpu_supports); a portable loop does the rest.
 *
 * Threads: the panels are split over PyTorch's own OpenMP threads (_parallel.h).
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
    const float *x; /* transposed: [d_in, M] */
    const int8_t *q; /* panels [ceil(d_out / 8), d_in, 8] */
    const float *s;
    const float *b; /* or NULL */
    float *y;
    Py_ssize_t M, d_in, d_out;
} Job;

typedef void (*Kernel)(const Job *, Py_ssize_t j0, Py_ssize_t j1);

/* ---- portable kernel ---------------------------------------------------------------- */

static void rows_scalar(const Job *J, Py_ssize_t p0, Py_ssize_t p1) { /* panels p0 .. p1-1 */
    const Py_ssize_t n = J->d_in, M = J->M;
    for (Py_ssize_t j = p0 * 8; j < p1 * 8 && j < J->d_out; j++) {
        const int8_t *w = J->q + (j / 8) * n * 8 + j % 8;
        for (Py_ssize_t m = 0; m < M; m++) {
            float acc = 0.0f;
            for (Py_ssize_t i = 0; i < n; i++) acc += J->x[i * M + m] * (float)w[8 * i];
            J->y[m * J->d_out + j] = acc * J->s[j] + (J->b ? J->b[j] : 0.0f);
        }
    }
}

/* ---- AVX2 + FMA kernel ---------------------------------------------------------------- */
#if HAVE_X86
#define TARGET __attribute__((target("avx2,fma")))

TARGET static inline __m256 load8(const int8_t *p) { /* 8 int8 → 8 float32 */
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* y[m0.., 8p .. 8p+7] = acc · s + b for one panel, the last one cut at d_out */
TARGET static inline void store(const Job *J, Py_ssize_t p, Py_ssize_t m, __m256 acc) {
    const Py_ssize_t j = 8 * p;
    float *y = J->y + m * J->d_out + j;
    if (j + 8 <= J->d_out) {
        __m256 v = _mm256_mul_ps(acc, _mm256_loadu_ps(J->s + j));
        _mm256_storeu_ps(y, J->b ? _mm256_add_ps(v, _mm256_loadu_ps(J->b + j)) : v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    for (Py_ssize_t c = 0; j + c < J->d_out; c++) y[c] = t[c] * J->s[j + c] + (J->b ? J->b[j + c] : 0.0f);
}

/* P panels (p .. p+P-1) against all M rows of x: P·M 8-wide accumulators, in registers (the
 * loops over P and M have constant bounds and unroll). */
#define PANELS(M, P)                                                                          \
    TARGET static void panels_##M##_##P(const Job *J, Py_ssize_t p) {                         \
        const Py_ssize_t n = J->d_in;                                                         \
        const float *x = J->x;                                                                \
        const int8_t *q = J->q + p * n * 8;                                                   \
        __m256 acc[P][M];                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < P; r++)                                   \
        _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) acc[r][m] = _mm256_setzero_ps();  \
        Py_ssize_t i = 0;                                                                     \
        for (; i + 8 <= n; i += 8) { /* a cache line of each panel per turn, prefetched */   \
            _Pragma("GCC unroll 8") for (int r = 0; r < P; r++)                               \
                _mm_prefetch((const char *)(q + r * n * 8 + 8 * i + 1024), _MM_HINT_T0);      \
            _Pragma("GCC unroll 8") for (Py_ssize_t u = i; u < i + 8; u++) STEP(M, P, u);     \
        }                                                                                     \
        for (; i < n; i++) STEP(M, P, i);                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < P; r++)                                   \
        _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) store(J, p + r, m, acc[r][m]);    \
    }
#define STEP(M, P, u)                                                                         \
    do {                                                                                      \
        __m256 w[P];                                                                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < P; r++) w[r] = load8(q + r * n * 8 + 8 * (u)); \
        _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) {                                 \
            __m256 xv = _mm256_broadcast_ss(x + (u) * M + m);                                 \
            _Pragma("GCC unroll 8") for (int r = 0; r < P; r++)                               \
                acc[r][m] = _mm256_fmadd_ps(w[r], xv, acc[r][m]);                             \
        }                                                                                     \
    } while (0)

PANELS(1, 4)
PANELS(1, 1)
PANELS(2, 4)
PANELS(2, 1)
PANELS(3, 2)
PANELS(3, 1)
PANELS(4, 2)
PANELS(4, 1)
PANELS(5, 2)
PANELS(5, 1)
PANELS(6, 2)
PANELS(6, 1)
PANELS(7, 1)
PANELS(8, 1)

typedef void (*PanelFn)(const Job *, Py_ssize_t);

/* panels p0 .. p1-1: `wide` panels at a time (4, 2 or 1 by M), then one at a time */
TARGET static void rows_avx2(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    static const PanelFn wide[MAX_ROWS + 1] = {NULL, panels_1_4, panels_2_4, panels_3_2,
                                               panels_4_2, panels_5_2, panels_6_2, panels_7_1,
                                               panels_8_1};
    static const PanelFn one[MAX_ROWS + 1] = {NULL, panels_1_1, panels_2_1, panels_3_1,
                                              panels_4_1, panels_5_1, panels_6_1, panels_7_1,
                                              panels_8_1};
    static const int width[MAX_ROWS + 1] = {0, 4, 4, 2, 2, 2, 2, 1, 1};
    const int P = width[J->M];
    Py_ssize_t p = p0;
    for (; p + P <= p1; p += P) wide[J->M](J, p);
    for (; p < p1; p++) one[J->M](J, p);
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

static void part(const void *job, int k, int parts) { /* panels of part k, in fours */
    const Job *J = job;
    int p0, p1;
    share((int)((J->d_out + 7) / 8), 4, k, parts, &p0, &p1);
    if (p0 < p1) KERNEL(J, p0, p1);
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
    /* x transposed, [d_in, M]: the kernels broadcast x[m, i] for m = 0 .. M-1 in turn */
    const float *x_rows = (const float *)(uintptr_t)x;
    float *xt = NULL;
    if (M > 1) {
        xt = PyMem_RawMalloc(sizeof(float) * (size_t)(d_in > 0 ? M * d_in : 1));
        if (!xt) return PyErr_NoMemory();
        for (Py_ssize_t m = 0; m < M; m++)
            for (Py_ssize_t i = 0; i < d_in; i++) xt[i * M + m] = x_rows[m * d_in + i];
    }
    Job J = {xt ? xt : x_rows, (const int8_t *)(uintptr_t)q, (const float *)(uintptr_t)s,
             (const float *)(uintptr_t)b, (float *)(uintptr_t)y, M, d_in, d_out};
    Py_BEGIN_ALLOW_THREADS run(&J, threads);
    Py_END_ALLOW_THREADS PyMem_RawFree(xt);
    Py_RETURN_NONE;
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
     "gemv(x, p, s, b, y, M, d_in, d_out, threads): y = (x qᵀ)·s + b, q in panels p [d_out/8 "
     "(rounded up), d_in, 8]; addresses as ints, b 0 for none (the GIL is released)"},
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
