/* Gradient clipping's passes over many float32 buffers, for glassgpt's _rowwise extension:
 *
 *   sum_squares(addresses, lengths, threads) → Σ x² over float32 buffers (a tuple of each),
 *                              in float64, chunk by chunk in a fixed order, in parts, the
 *                              GIL released (‖g‖₂², one call for all the gradients)
 *   scale_many(addresses, lengths, factor, threads)   x ← factor · x in each buffer, likewise
 *
 * Σ x² with AVX2 + FMA or as a portable loop, picked by pick_clip. Include once, from
 * _rowwise.c (after _cpu.h, _parallel.h, _module.h and part_count).
 */
#ifndef GLASSGPT_CLIP_H
#define GLASSGPT_CLIP_H

/* Σ x² over n float32 values, accumulated in float64 (a gradient's share of ‖g‖₂²). */
typedef double (*SumSqFn)(const float *x, Py_ssize_t n);

static double sum_sq_portable(const float *x, Py_ssize_t n) {
    double acc[4] = {0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++)
            acc[l] += (double)x[i + l] * x[i + l];
    for (; i < n; i++)
        acc[0] += (double)x[i] * x[i];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

#if GG_X86
AVX2 static double sum_sq_avx2(const float *x, Py_ssize_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
        __m256d u0 = _mm256_cvtps_pd(_mm256_castps256_ps128(u));
        __m256d u1 = _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1));
        __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(w));
        __m256d w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1));
        a0 = _mm256_fmadd_pd(u0, u0, a0), a1 = _mm256_fmadd_pd(u1, u1, a1);
        a2 = _mm256_fmadd_pd(w0, w0, a2), a3 = _mm256_fmadd_pd(w1, w1, a3);
    }
    __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a2), _mm256_add_pd(a1, a3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double total = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    return total + sum_sq_portable(x + i, n - i);
}
#endif

static SumSqFn SUM_SQ = sum_sq_portable;

static void pick_clip(int avx2) {
    SUM_SQ = sum_sq_portable;
#if GG_X86
    if (avx2)
        SUM_SQ = sum_sq_avx2;
#endif
}

/* The gradients of a clipping step: many float32 buffers, cut into chunks of SQ_CHUNK values
 * (one buffer's tail is a chunk of its own), the chunks shared among the parts. */
#define SQ_CHUNK 16384

typedef struct {
    float **x;          /* the buffers */
    long long *n;       /* their lengths */
    long long *first;   /* chunk index of each buffer's first chunk; first[count] = chunks */
    int count, chunks;
    double *sums;       /* one per chunk (sum_squares) */
    float factor;       /* scale_many */
} Buffers;

/* The buffer and offset of chunk c. */
static void chunk_at(const Buffers *b, int c, int *buf, long long *lo, long long *len) {
    int i = *buf;
    while (b->first[i + 1] <= c)
        i++;
    *buf = i;
    *lo = (c - b->first[i]) * (long long)SQ_CHUNK;
    *len = b->n[i] - *lo < SQ_CHUNK ? b->n[i] - *lo : SQ_CHUNK;
}

/* Each chunk of the part: its Σ x² into sums (sum_squares), else x ← factor · x (scale_many). */
static void chunks_part(const void *job, int part, int parts) {
    const Buffers *b = job;
    int lo, hi, buf = 0;
    share(b->chunks, 1, part, parts, &lo, &hi);
    for (int c = lo; c < hi; c++) {
        long long at, len;
        chunk_at(b, c, &buf, &at, &len);
        float *x = b->x[buf] + at;
        if (b->sums)
            b->sums[c] = SUM_SQ(x, (Py_ssize_t)len);
        else
            for (long long i = 0; i < len; i++)
                x[i] *= b->factor;
    }
}

/* Room in b for `count` buffers (raw memory: no GIL needed); False where there is none. */
static int alloc_buffers(Buffers *b, long long count) {
    b->count = (int)count;
    b->x = PyMem_RawMalloc(sizeof(float *) * (size_t)(count + 1));
    b->n = PyMem_RawMalloc(sizeof(long long) * (size_t)(count + 1));
    b->first = PyMem_RawMalloc(sizeof(long long) * (size_t)(count + 1));
    b->sums = NULL;
    return b->x && b->n && b->first;
}

/* Buffer i at `address` of n values, after `*chunks` chunks (advanced); -1 with err set. */
static int lay_out(Buffers *b, long long i, long long address, long long n, long long *chunks,
                   KernelError *err) {
    if (n < 0)
        return kernel_fail(err, KERR_VALUE, "need lengths >= 0; got %lld", n);
    b->n[i] = n;
    b->x[i] = (float *)(uintptr_t)address;
    b->first[i] = *chunks;
    *chunks += (n + SQ_CHUNK - 1) / SQ_CHUNK;
    if (*chunks > INT32_MAX)
        return kernel_fail(err, KERR_VALUE, "too many values");
    return 0;
}

/* Parses (addresses, lengths, ..., threads) into b (chunks laid out); False with an error set. */
static int buffers(PyObject *addresses, PyObject *lengths, Buffers *b) {
    if (!PyTuple_Check(addresses) || !PyTuple_Check(lengths) ||
        PyTuple_GET_SIZE(addresses) != PyTuple_GET_SIZE(lengths)) {
        PyErr_SetString(PyExc_TypeError, "need two tuples of equal length: addresses, lengths");
        return 0;
    }
    const Py_ssize_t count = PyTuple_GET_SIZE(addresses);
    if (count > INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "too many buffers");
        return 0;
    }
    if (!alloc_buffers(b, count)) {
        PyErr_NoMemory();
        return 0;
    }
    long long chunks = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long a, n;
        KernelError err;
        if (!ints(&PyTuple_GET_ITEM(addresses, i), 1, &a) ||
            !ints(&PyTuple_GET_ITEM(lengths, i), 1, &n))
            return 0;
        if (lay_out(b, i, a, n, &chunks, &err) < 0) {
            raise_kernel_error(&err);
            return 0;
        }
    }
    b->first[count] = chunks;
    b->chunks = (int)chunks;
    return 1;
}

static void free_buffers(Buffers *b) {
    PyMem_RawFree(b->x), PyMem_RawFree(b->n), PyMem_RawFree(b->first), PyMem_RawFree(b->sums);
}

/* sum_squares(addresses, lengths, threads) → Σ x² over every value, in float64, in a fixed
 * order (chunk by chunk): the same for any thread count. */
static PyObject *sum_squares(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long threads;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sum_squares(addresses, lengths, threads)");
        return NULL;
    }
    Buffers b = {0};
    if (!buffers(args[0], args[1], &b) || !ints(args + 2, 1, &threads)) {
        free_buffers(&b);
        return NULL;
    }
    b.sums = PyMem_RawMalloc(sizeof(double) * (size_t)(b.chunks + 1));
    if (!b.sums) {
        free_buffers(&b);
        return PyErr_NoMemory();
    }
    const int parts = part_count(threads, b.chunks);
    Py_BEGIN_ALLOW_THREADS
    run_parts(chunks_part, &b, parts);
    Py_END_ALLOW_THREADS
    double total = 0.0;
    for (int c = 0; c < b.chunks; c++)
        total += b.sums[c];
    free_buffers(&b);
    return PyFloat_FromDouble(total);
}

/* scale_many(addresses, lengths, factor, threads): x ← factor · x (float32) in every buffer. */
static PyObject *scale_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long threads;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scale_many(addresses, lengths, factor, threads)");
        return NULL;
    }
    Buffers b = {0};
    const double factor = PyFloat_AsDouble(args[2]);
    if ((factor == -1.0 && PyErr_Occurred()) || !buffers(args[0], args[1], &b) ||
        !ints(args + 3, 1, &threads)) {
        free_buffers(&b);
        return NULL;
    }
    b.factor = (float)factor;
    const int parts = part_count(threads, b.chunks);
    Py_BEGIN_ALLOW_THREADS
    run_parts(chunks_part, &b, parts);
    Py_END_ALLOW_THREADS
    free_buffers(&b);
    Py_RETURN_NONE;
}

/* scale_many from its slots (SCALE_MANY's format: the addresses' count and items, the
 * lengths' count and items, then threads; the factor a double): a replayed step's s · W_E[t]. */
static int scale_many_impl(const long long *a, const double *dv, KernelError *err) {
    const long long count = a[0];
    if (a[1 + count] != count)
        return kernel_fail(err, KERR_TYPE, "need two tuples of equal length: addresses, lengths");
    Buffers b = {0};
    long long chunks = 0;
    int rc = alloc_buffers(&b, count) ? 0 : kernel_fail(err, KERR_MEMORY, "out of memory");
    for (long long i = 0; rc == 0 && i < count; i++)
        rc = lay_out(&b, i, a[1 + i], a[2 + count + i], &chunks, err);
    if (rc == 0) {
        b.first[count] = chunks, b.chunks = (int)chunks, b.factor = (float)dv[0];
        run_parts(chunks_part, &b, part_count(a[2 + 2 * count], b.chunks));
    }
    free_buffers(&b);
    return rc;
}

/* (the wrapper above parses any number of buffers; a program takes as many as fit its slots) */
static const KernelEntry SCALE_MANY = {"scale_many", "ttdi", scale_many_impl, 1,
                                       "scale_many(addresses, lengths, factor, threads)"};

#endif
