/* Greedy decoding's pick, for glassgpt's _rowwise extension:
 *
 *   argmax_rows(z, B, V, stride) → [the first index of the largest of the first V values of
 *                              each of B float32 rows, stride apart], or None where a row
 *                              holds a NaN or an infinite largest value
 *
 * 8 lanes at a time with AVX2, or a portable loop, picked by pick_argmax. Include once, from
 * _rowwise.c (after _cpu.h and _module.h).
 */
#ifndef GLASSGPT_ARGMAX_H
#define GLASSGPT_ARGMAX_H

typedef long long (*ArgmaxFn)(const float *z, long long n, int *finite);

/* The first index of z's largest value over n > 0 values; *finite = 0 where a value is NaN
 * or the largest is ±inf (the caller then takes PyTorch's path, which handles those). */
static long long argmax_portable(const float *z, long long n, int *finite) {
    long long k = 0;
    float m = z[0];
    int nan = 0;
    for (long long i = 0; i < n; i++) {
        nan |= z[i] != z[i];
        if (z[i] > m)
            m = z[i], k = i;
    }
    *finite = !nan && isfinite(m);
    return k;
}

#if GG_X86
/* argmax_portable with 8 lanes, each keeping its first largest value and that value's index
 * (n < 2^31); the lanes' largest value, at the smallest index among the lanes that hold it,
 * is the first largest of z. */
AVX2 static long long argmax_avx2(const float *z, long long n, int *finite) {
    if (n < 16)
        return argmax_portable(z, n, finite);
    __m256 best = _mm256_loadu_ps(z);
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = at;
    __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
    const __m256i eight = _mm256_set1_epi32(8);
    long long i = 8;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(z + i);
        idx = _mm256_add_epi32(idx, eight);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, v, gt);
        at = _mm256_blendv_epi8(at, idx, _mm256_castps_si256(gt));
    }
    float bv[8];
    int bi[8];
    _mm256_storeu_ps(bv, best);
    _mm256_storeu_si256((__m256i *)bi, at);
    float m = bv[0];
    long long k = bi[0];
    for (int l = 1; l < 8; l++)
        if (bv[l] > m || (bv[l] == m && bi[l] < k))
            m = bv[l], k = bi[l];
    int bad = _mm256_movemask_ps(nan) != 0;
    for (; i < n; i++) { /* the last values come after every lane's: ties keep the lanes' */
        bad |= z[i] != z[i];
        if (z[i] > m)
            m = z[i], k = i;
    }
    *finite = !bad && isfinite(m);
    return k;
}
#endif

static ArgmaxFn ARGMAX = argmax_portable;

static void pick_argmax(int avx2) {
    ARGMAX = argmax_portable;
#if GG_X86
    if (avx2)
        ARGMAX = argmax_avx2;
#endif
}

/* argmax_rows(z, B, V, stride) → [the first index of the largest of V values of each row of
 * z, rows stride floats apart], or None where a row holds a NaN or has an infinite largest
 * value. A list, not a tensor: after a decoding step's weights streamed through every cache,
 * each PyTorch operation (its code cold) took 30-50 µs. */
static PyObject *argmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[4];
    if (!int_args(args, nargs, 4, a, "argmax_rows(z, B, V, stride)"))
        return NULL;
    if (a[1] < 0 || a[2] <= 0 || a[2] > INT32_MAX || a[3] < a[2]) {
        PyErr_SetString(PyExc_ValueError, "argmax_rows: need B >= 0 and 0 < V <= stride, V < 2^31");
        return NULL;
    }
    const float *z = (const float *)(uintptr_t)a[0];
    PyObject *ids = PyList_New((Py_ssize_t)a[1]);
    if (!ids)
        return NULL;
    for (long long b = 0; b < a[1]; b++) {
        int finite;
        const long long k = ARGMAX(z + b * a[3], a[2], &finite);
        PyObject *id = finite ? PyLong_FromLongLong(k) : NULL;
        if (!id) {
            Py_DECREF(ids);
            if (finite)
                return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(ids, (Py_ssize_t)b, id);
    }
    return ids;
}

#endif
