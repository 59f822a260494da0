/* Attention for a few queries over cached keys and values (decoding), float32:
 *
 *   z[b, h, i, :] = Σ_j p_j v[b, h, j, :],   p = softmax_j(q[b, h, i, :] · k[b, h, j, :] / √D)
 *
 * over the keys j that query i may see: j ≤ offset + i (causal), or, when a boolean mask
 * is given, the j with mask[b, h, i, j] true (the mask replaces the causal rule). A query
 * that may see no key gets z = 0.
 *
 * Each (b, h, i) is one item: its scores go to a scratch row, then z is the exp-weighted sum
 * of the value rows over the normaliser, in float32 (AVX2 + FMA for the dot products and
 * the weighted sums where the CPU has them and D is a multiple of 8, plain C otherwise).
 * The items are split over PyTorch's own OpenMP threads (kernels/_parallel.h) when there
 * is enough work to pay for waking a second thread. The GIL is released while they run.
 *
 * Python API (pointers are addresses of float32 buffers, the mask's of bytes; strides are in
 * elements, any may be 0 (broadcast); the caller checks shapes and dtypes):
 *   attend(q, k, v, mask or 0, z, B, H, Tq, Tk, D, offset, strides, threads)
 *   strides: a tuple of 20 ints, (b, h, t, d) for q, k, v, mask and z in that order.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>

#include "_parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GG_X86 1
#else
#define GG_X86 0
#endif

#define MAX_THREADS 256

typedef struct {
    const float *q, *k, *v;
    const unsigned char *mask;
    float *z;
    int B, H, Tq, Tk, D;
    long long offset;
    long long s[20]; /* (b, h, t, d) strides of q, k, v, mask, z */
    float *scratch;  /* Tk floats per part */
    float scale;
} Job;

static int use_avx2 = -1;

/* ------------------------------------------------------------------- plain C kernels -- */

static float dot_plain(const float *a, const float *b, long long sb, int D, long long sa) {
    float acc = 0.0f;
    for (int d = 0; d < D; d++)
        acc += a[d * sa] * b[d * sb];
    return acc;
}

/* ---------------------------------------------------------------- AVX2 + FMA kernels -- */
#if GG_X86
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static float dot_avx2(const float *a, const float *b, int D) {
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static void axpy_avx2(float *y, float w, const float *x, int D) {
    __m256 wv = _mm256_set1_ps(w);
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
static int cpu_has_avx2(void) { return 0; }
#endif

/* z for one item (b, h, i), its scores in s[0 .. Tk). */
static void attend_item(const Job *j, int b, int h, int i, float *s) {
    const long long *st = j->s;
    const float *q = j->q + b * st[0] + h * st[1] + i * st[2];
    const float *k = j->k + b * st[4] + h * st[5];
    const float *v = j->v + b * st[8] + h * st[9];
    const unsigned char *mask = j->mask ? j->mask + b * st[12] + h * st[13] + i * st[14] : NULL;
    float *z = j->z + b * st[16] + h * st[17] + i * st[18];
    const int D = j->D;
    long long seen = j->offset + i + 1; /* causal: keys 0 .. offset + i */
    const int n = mask ? j->Tk : (int)(seen < j->Tk ? (seen > 0 ? seen : 0) : j->Tk);
    /* fast: unit strides along d and D a multiple of 8 */
    const int fast = use_avx2 && D % 8 == 0 && st[3] == 1 && st[7] == 1 && st[11] == 1 &&
                     st[19] == 1;
    float best = -INFINITY;
    for (int t = 0; t < n; t++) {
        if (mask && !mask[t * st[15]]) {
            s[t] = -INFINITY;
            continue;
        }
        const float *kt = k + t * st[6];
#if GG_X86
        s[t] = (fast ? dot_avx2(q, kt, D) : dot_plain(q, kt, st[7], D, st[3])) * j->scale;
#else
        s[t] = dot_plain(q, kt, st[7], D, st[3]) * j->scale;
#endif
        if (s[t] > best)
            best = s[t];
    }
    for (int d = 0; d < D; d++)
        z[d * st[19]] = 0.0f;
    if (best == -INFINITY) /* no key to see */
        return;
    float total = 0.0f;
    for (int t = 0; t < n; t++) {
        if (s[t] == -INFINITY)
            continue;
        float w = expf(s[t] - best);
        total += w;
        const float *vt = v + t * st[10];
#if GG_X86
        if (fast) {
            axpy_avx2(z, w, vt, D);
            continue;
        }
#endif
        for (int d = 0; d < D; d++)
            z[d * st[19]] += w * vt[d * st[11]];
    }
    float inv = 1.0f / total;
    for (int d = 0; d < D; d++)
        z[d * st[19]] *= inv;
}

/* Part p of the items (b, h, i), in row-major order. */
static void attend_part(const void *job, int part, int parts) {
    const Job *j = job;
    int n = j->B * j->H * j->Tq, lo, hi;
    share(n, 1, part, parts, &lo, &hi);
    float *s = j->scratch + (size_t)part * j->Tk;
    for (int item = lo; item < hi; item++) {
        int i = item % j->Tq, bh = item / j->Tq;
        attend_item(j, bh / j->H, bh % j->H, i, s);
    }
}

/* ------------------------------------------------------------------------- Python -- */

static PyObject *py_attend(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, mask, z;
    int B, H, Tq, Tk, D, threads;
    long long offset;
    PyObject *strides;
    if (!PyArg_ParseTuple(args, "KKKKKiiiiiLO!i", &q, &k, &v, &mask, &z, &B, &H, &Tq, &Tk, &D,
                          &offset, &PyTuple_Type, &strides, &threads))
        return NULL;
    if (B < 1 || H < 1 || Tq < 1 || Tk < 1 || D < 1 || PyTuple_GET_SIZE(strides) != 20) {
        PyErr_Format(PyExc_ValueError,
                     "attend: need B, H, Tq, Tk, D >= 1 and 20 strides; got %d, %d, %d, %d, %d",
                     B, H, Tq, Tk, D);
        return NULL;
    }
    Job job = {(const float *)(uintptr_t)q, (const float *)(uintptr_t)k,
               (const float *)(uintptr_t)v, (const unsigned char *)(uintptr_t)mask,
               (float *)(uintptr_t)z, B, H, Tq, Tk, D, offset, {0}, NULL,
               1.0f / sqrtf((float)D)};
    for (int i = 0; i < 20; i++) {
        job.s[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
        if (job.s[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    int items = B * H * Tq;
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > items)
        threads = items;
    /* A second thread's wake-up costs about as much as 2^17 multiply-adds here. */
    if ((long long)items * Tk * D < (1LL << 17))
        threads = 1;
    job.scratch = PyMem_RawMalloc(sizeof(float) * (size_t)threads * Tk);
    if (!job.scratch)
        return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    run_parts(attend_part, &job, threads);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(job.scratch);
    Py_RETURN_NONE;
}

static PyObject *py_has_avx2(PyObject *self, PyObject *args) { return PyBool_FromLong(use_avx2); }

static PyMethodDef methods[] = {
    {"attend", py_attend, METH_VARARGS, "z = softmax(q kᵀ/√D + M) v for a few queries"},
    {"has_avx2", py_has_avx2, METH_NOARGS, "whether the AVX2 + FMA kernels are in use"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attend", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attend(void) {
    use_avx2 = cpu_has_avx2();
    return PyModule_Create(&module);
}
