/* Attention for a few queries over cached keys and values (decoding), float32:
 *
 *   z[b, h, i, :] = Σ_j p_j v[b, h, j, :],   p = softmax_j(q[b, h, i, :] · k[b, h, j, :] / √D)
 *
 * over the keys j that query i may see: j ≤ offset + i (causal), with row b's own offset
 * offsets[b] where per-row offsets are given (a batch of sequences of different lengths),
 * or, when a boolean mask is given, the j with mask[b, h, i, j] true (the mask replaces the
 * causal rule). A query that may see no key gets z = 0.
 *
 * Each (b, h, i) is one item: its scores go to a scratch row, then z is the exp-weighted sum
 * of the value rows over the normaliser, in float32. With AVX2 + FMA (and D a multiple of
 * 8, unit strides along d): four keys' dot products at a time, a vectorised exp, and z's
 * columns held in registers across the keys; plain C with libm's expf otherwise.
 * The items are split over PyTorch's own OpenMP threads (kernels/_parallel.h) when there
 * is enough work to pay for waking a second thread. The GIL is released while they run.
 *
 * Python API (pointers are addresses of float32 buffers, the mask's of bytes; strides are in
 * elements, any may be 0 (broadcast); the caller checks shapes and dtypes):
 *   attend(q, k, v, mask or 0, z, B, H, Tq, Tk, D, offset, strides, threads[, offsets,
 *          group, scale, cap, window])
 *   strides: a tuple of 20 ints, (b, h, t, d) for q, k, v, mask and z in that order;
 *   offsets: the address of B int64 offsets (0 or absent: `offset` for every row), read
 *   when the call runs; group: query heads per key/value head (grouped-query attention:
 *   query head h reads k, v head h / group; default 1); scale: the scores' factor (0 or
 *   absent: 1/√D); cap: soft-capped scores c·tanh(s/c) (0: none); window: query i sees only
 *   the keys j > offset + i − window (0: all).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>

#include "_cpu.h"
#include "_parallel.h"
#include "_program.h" /* KernelEntry, run_slots(), export_impls() */

#define MAX_THREADS 256

typedef struct {
    const float *q, *k, *v;
    const unsigned char *mask;
    float *z;
    int B, H, Tq, Tk, D;
    long long offset;
    const long long *offsets; /* per row, or NULL */
    long long s[20]; /* (b, h, t, d) strides of q, k, v, mask, z */
    float *scratch;  /* Tk floats per part */
    float scale;
    int group;       /* query heads per key/value head */
    float cap;       /* soft cap c of the scores (0: none) */
    long long window; /* keys within the window (0: all) */
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
#include "_vexp.h"

/* Ask for the row of D floats at p (its 64-byte lines) AHEAD rows before it is read: a cached
 * key or value row is read once per step, from memory (the step's weights streamed through
 * every cache since), and an item's rows are few, so the hardware's stream prefetcher
 * barely ramps up within one. */
#define AHEAD 16
#define LEAD 128 /* the next item's first rows asked for into L2 (prefetch_item) */
#ifndef GG_NO_PREFETCH
#define PREFETCH_ROW(p, D)                                                                     \
    do {                                                                                       \
        for (int l_ = 0; l_ < (D); l_ += 16)                                                   \
            _mm_prefetch((const char *)((p) + l_), _MM_HINT_T0);                              \
    } while (0)
#else
#define PREFETCH_ROW(p, D) ((void)0)
#endif

/* s[t] = scale · q · k_t for t in [0, n), four keys at a time (independent sums); the key
 * rows AHEAD on, and the first AHEAD value rows (mix_avx2 reads them next), asked for. */
AVX2 static void scores_avx2(const float *q, const float *k, long long sk, const float *v,
                             long long sv, int n, int D, float scale, float *s) {
    for (int t = 0; t < AHEAD && t < n; t++)
        PREFETCH_ROW(k + t * sk, D);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        const float *k0 = k + t * sk, *k1 = k0 + sk, *k2 = k1 + sk, *k3 = k2 + sk;
        for (int u = t + AHEAD; u < t + AHEAD + 4 && u < n; u++)
            PREFETCH_ROW(k + u * sk, D);
        if (t < AHEAD)
            for (int u = t; u < t + 4 && u < n; u++)
                PREFETCH_ROW(v + u * sv, D);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < D; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(s + t, _mm_mul_ps(sum, _mm_set1_ps(scale)));
    }
    for (; t < n; t++) {
        const float *kt = k + t * sk;
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kt + d), a);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        s[t] = _mm_cvtss_f32(h) * scale;
    }
}

/* exp(x) for 8 lanes, x ≤ 0 (a score minus the row maximum), by exp8 (_vexp.h);
 * −∞ (a hidden key) gives exactly 0. */
AVX2 static __m256 exp_avx2(__m256 x) {
    const __m256 hidden = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(hidden, exp8(x));
}

/* s[t] ← exp(s[t] − best) for t in [0, n); returns their sum. */
AVX2 static float exps_avx2(float *s, int n, float best) {
    __m256 total = _mm256_setzero_ps(), b = _mm256_set1_ps(best);
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 w = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + t), b));
        _mm256_storeu_ps(s + t, w);
        total = _mm256_add_ps(total, w);
    }
    float tail[8] = {0};
    float rest = 0.0f;
    if (t < n) {
        __m256 in = _mm256_set1_ps(-INFINITY);
        for (int u = t; u < n; u++)
            tail[u - t] = s[u];
        in = _mm256_loadu_ps(tail);
        _mm256_storeu_ps(tail, exp_avx2(_mm256_sub_ps(in, b)));
        for (int u = t; u < n; u++) {
            s[u] = tail[u - t];
            rest += tail[u - t];
        }
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h) + rest;
}

/* The first AHEAD key rows of item `item`'s (b, h) into L1, and its first LEAD key and value
 * rows (of those its last query sees) into L2, asked for while the item before it runs,
 * unless that one reads the same rows: each item's rows start cold (a decoding step's
 * weights have streamed through the caches since), and a short run of rows (a server's
 * contexts), 64 KB from the next item's on 4 KiB pages, ends before the hardware's
 * prefetcher ramps up (docs/performance.md, "A step of 8 rows and a prompt of 32"). */
static void prefetch_item(const Job *j, int item) {
    const int bh = item / j->Tq, b = bh / j->H, h = bh % j->H;
    const float *k = j->k + b * j->s[4] + (h / j->group) * j->s[5];
    for (int t = 0; t < AHEAD && t < j->Tk; t++)
        PREFETCH_ROW(k + t * j->s[6], j->D);
#ifndef GG_NO_PREFETCH
    const float *v = j->v + b * j->s[8] + (h / j->group) * j->s[9];
    const int before = (item - 1) / j->Tq; /* the item running now: its rows are in flight */
    if (before / j->H == b && (before % j->H) / j->group == h / j->group)
        return; /* the same key/value head (grouped-query attention) */
    const long long seen = (j->offsets ? j->offsets[b] : j->offset) + j->Tq;
    const int n = j->mask ? j->Tk : (int)(seen < j->Tk ? (seen > 0 ? seen : 0) : j->Tk);
    const int t0 = j->window > 0 && !j->mask && n > j->window ? n - (int)j->window : 0;
    for (int t = t0; t < n && t < t0 + LEAD; t++)
        for (int l = 0; l < j->D; l += 16) {
            if (t >= AHEAD)
                _mm_prefetch((const char *)(k + t * j->s[6] + l), _MM_HINT_T1);
            _mm_prefetch((const char *)(v + t * j->s[10] + l), _MM_HINT_T1);
        }
#endif
}

/* z = Σ_t w[t] v_t / total, 64 columns of D at a time held in registers (then 32, then 8),
 * so that D ≤ 64 reads each value row once; the rows AHEAD on asked for. */
AVX2 static void mix_avx2(const float *w, const float *v, long long sv, int n, int D, float total,
                          float *z) {
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    int d = 0;
    for (; d + 64 <= D; d += 64) {
        __m256 a[8];
        for (int r = 0; r < 8; r++)
            a[r] = _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const float *vt = v + t * sv + d;
            if (t + AHEAD < n)
                PREFETCH_ROW(vt + AHEAD * sv, 64);
            const __m256 wt = _mm256_set1_ps(w[t]);
            for (int r = 0; r < 8; r++)
                a[r] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vt + 8 * r), a[r]);
        }
        for (int r = 0; r < 8; r++)
            _mm256_storeu_ps(z + d + 8 * r, _mm256_mul_ps(a[r], inv));
    }
    for (; d + 32 <= D; d += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int t = 0; t < n; t++) {
            const float *vt = v + t * sv + d;
            if (t + AHEAD < n)
                PREFETCH_ROW(vt + AHEAD * sv, 32);
            __m256 wt = _mm256_set1_ps(w[t]);
            a0 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vt), a0);
            a1 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vt + 8), a1);
            a2 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vt + 16), a2);
            a3 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(vt + 24), a3);
        }
        _mm256_storeu_ps(z + d, _mm256_mul_ps(a0, inv));
        _mm256_storeu_ps(z + d + 8, _mm256_mul_ps(a1, inv));
        _mm256_storeu_ps(z + d + 16, _mm256_mul_ps(a2, inv));
        _mm256_storeu_ps(z + d + 24, _mm256_mul_ps(a3, inv));
    }
    for (; d < D; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int t = 0; t < n; t++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[t]), _mm256_loadu_ps(v + t * sv + d), a);
        _mm256_storeu_ps(z + d, _mm256_mul_ps(a, inv));
    }
}

#endif

/* z for one item (b, h, i), its scores in s[0 .. Tk). */
static void attend_item(const Job *j, int b, int h, int i, float *s) {
    const long long *st = j->s;
    const float *q = j->q + b * st[0] + h * st[1] + i * st[2];
    const int g = h / j->group; /* the key/value head this query head reads */
    const float *k = j->k + b * st[4] + g * st[5];
    const float *v = j->v + b * st[8] + g * st[9];
    const unsigned char *mask = j->mask ? j->mask + b * st[12] + h * st[13] + i * st[14] : NULL;
    float *z = j->z + b * st[16] + h * st[17] + i * st[18];
    const int D = j->D;
    long long seen = (j->offsets ? j->offsets[b] : j->offset) + i + 1; /* keys 0 .. offset + i */
    int n = mask ? j->Tk : (int)(seen < j->Tk ? (seen > 0 ? seen : 0) : j->Tk);
    if (j->window > 0 && !mask && n > j->window) { /* keys n − window .. n − 1 */
        k += (n - j->window) * st[6], v += (n - j->window) * st[10];
        n = (int)j->window;
    }
    /* fast: unit strides along d and D a multiple of 8 */
    const int fast = use_avx2 && D % 8 == 0 && st[3] == 1 && st[7] == 1 && st[11] == 1 &&
                     st[19] == 1;
#if GG_X86
    if (fast)
        scores_avx2(q, k, st[6], v, st[10], n, D, j->scale, s);
#endif
    float best = -INFINITY;
    const float cap = j->cap;
    for (int t = 0; t < n; t++) {
        if (mask && !mask[t * st[15]])
            s[t] = -INFINITY;
        else if (!fast)
            s[t] = dot_plain(q, k + t * st[6], st[7], D, st[3]) * j->scale;
        if (cap > 0.0f && s[t] != -INFINITY)
            s[t] = tanhf(s[t] / cap) * cap;
        if (s[t] > best)
            best = s[t];
    }
    if (best == -INFINITY) { /* no key to see */
        for (int d = 0; d < D; d++)
            z[d * st[19]] = 0.0f;
        return;
    }
#if GG_X86
    if (fast) {
        float total = exps_avx2(s, n, best);
        mix_avx2(s, v, st[10], n, D, total, z);
        return;
    }
#endif
    float total = 0.0f;
    for (int d = 0; d < D; d++)
        z[d * st[19]] = 0.0f;
    for (int t = 0; t < n; t++) {
        if (s[t] == -INFINITY)
            continue;
        float w = expf(s[t] - best);
        total += w;
        const float *vt = v + t * st[10];
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
#if GG_X86
        if (use_avx2 && item + 1 < hi && i + 1 == j->Tq) /* the next item is another (b, h) */
            prefetch_item(j, item + 1);
#endif
        attend_item(j, bh / j->H, bh % j->H, i, s);
    }
}

/* ------------------------------------------------------------------------- Python -- */

/* The slots by ATTEND's format: q, k, v, mask, z, B, H, Tq, Tk, D, offset, 20 (the strides'
 * count), the 20 strides, threads, offsets, group, window; doubles scale, cap. */
static int attend_impl(const long long *a, const double *dv, KernelError *err) {
    const int B = (int)a[5], H = (int)a[6], Tq = (int)a[7], Tk = (int)a[8], D = (int)a[9];
    const int group = (int)a[34];
    if (B < 1 || H < 1 || Tq < 1 || Tk < 1 || D < 1 || a[11] != 20 || group < 1 || H % group)
        return kernel_fail(err, KERR_VALUE,
                           "attend: need B, H, Tq, Tk, D >= 1, 20 strides and group dividing H; "
                           "got %d, %d, %d, %d, %d, group %d", B, H, Tq, Tk, D, group);
    const double scale = dv[0];
    Job job = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[1],
               (const float *)(uintptr_t)a[2], (const unsigned char *)(uintptr_t)a[3],
               (float *)(uintptr_t)a[4], B, H, Tq, Tk, D, a[10],
               (const long long *)(uintptr_t)a[33], {0}, NULL,
               scale > 0.0 ? (float)scale : 1.0f / sqrtf((float)D), group, (float)dv[1], a[35]};
    for (int i = 0; i < 20; i++)
        job.s[i] = a[12 + i];
    int items = B * H * Tq;
    int threads = (int)a[32];
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > items)
        threads = items;
    /* A second thread pays from about 2^16 multiply-adds: a decoding step's attention reads
     * its cached keys and values from memory (the step's weights streamed through every
     * cache since), one core at a time below that. SmolLM2's 9 heads over 144 keys (2^16.3):
     * 20.5 µs on one thread, 17.0 on two, its worker warm from the product before (under
     * load; 300 keys 32.8 and 23.4; 64 keys no gain). It was 2^17 while waking a slept
     * worker was the cost; a decoding step's worker has just run the q, k, v product. */
    if ((long long)items * Tk * D < (1LL << 16))
        threads = 1;
    job.scratch = PyMem_RawMalloc(sizeof(float) * (size_t)threads * Tk);
    if (!job.scratch)
        return kernel_fail(err, KERR_MEMORY, "out of memory");
    run_parts(attend_part, &job, threads);
    PyMem_RawFree(job.scratch);
    return 0;
}

static const KernelEntry ATTEND = {"attend", "iiiiiiiiiiiti|ioddi", attend_impl, 1,
                                   "attend(q, k, v, mask, z, B, H, Tq, Tk, D, offset, strides, "
                                   "threads[, offsets, group, scale, cap, window])"};

/* The Python arguments parsed as before (PyArg_ParseTuple's types), then into ATTEND's slots. */
static PyObject *py_attend(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, mask, z;
    int B, H, Tq, Tk, D, threads;
    unsigned long long offsets = 0;
    long long offset, window = 0;
    int group = 1;
    double scale = 0.0, cap = 0.0;
    PyObject *strides;
    if (!PyArg_ParseTuple(args, "KKKKKiiiiiLO!i|KiddL", &q, &k, &v, &mask, &z, &B, &H, &Tq, &Tk,
                          &D, &offset, &PyTuple_Type, &strides, &threads, &offsets, &group,
                          &scale, &cap, &window))
        return NULL;
    const Py_ssize_t ns = PyTuple_GET_SIZE(strides);
    long long a[36] = {(long long)q, (long long)k, (long long)v, (long long)mask, (long long)z,
                       B, H, Tq, Tk, D, offset, ns};
    for (int i = 0; ns == 20 && i < 20; i++) {
        a[12 + i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
        if (a[12 + i] == -1 && PyErr_Occurred())
            return NULL;
    }
    a[32] = threads, a[33] = (long long)offsets, a[34] = group, a[35] = window;
    const double dv[2] = {scale, cap};
    return run_slots(&ATTEND, a, dv);
}

static const KernelEntry *const IMPLS[] = {&ATTEND, NULL};

static PyObject *py_has_avx2(PyObject *self, PyObject *args) { return PyBool_FromLong(use_avx2); }

static PyMethodDef methods[] = {
    {"attend", py_attend, METH_VARARGS, "z = softmax(q kᵀ/√D + M) v for a few queries"},
    {"has_avx2", py_has_avx2, METH_NOARGS, "whether the AVX2 + FMA kernels are in use"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attend", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attend(void) {
    use_avx2 = cpu_has_avx2();
    return export_impls(PyModule_Create(&module), IMPLS);
}
