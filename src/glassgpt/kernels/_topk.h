/* The rest of a sampler's pass over a step's rows, for glassgpt's _rowwise extension, after
 * _nucleus.h (whose pick_nucleus picks this header's top-k scan too, and whose int_args and
 * part_count these use):
 *
 *   top_k_fill(z, k, out, B, V, threads)   out = z with −inf where z_i < the k_b-th largest
 *                              of row b (top-k, the filter before top-p; see top_k_row)
 *   draw_rows(probs, cdf, u, ids, B, V)   the inverse-CDF draw of sample.filters.draw after
 *                              its softmax and cumsum (see draw_rows)
 *   finite_rows(z, ok, B, V)   ok_b = whether row b of z holds a finite value (isfinite.any)
 */

#ifndef GLASSGPT_TOPK_H
#define GLASSGPT_TOPK_H

/* Top-k's threshold without a sort: the k-th largest value of a row as torch.topk's values
 * give it (NaN counts as larger than +inf; ties by value, so which of equal values is k-th
 * does not matter) and the fill of sample.rows._top_k,
 *
 *     out_i = z_i < t_b ? −inf : z_i          t_b = topk(z_b, k_b).values[k_b − 1]
 *
 * (masked_fill's bits; a NaN t_b, k_b ≥ NaNs in the row, compares false: nothing is filled;
 * a NaN z_i is kept). Each value has an order key, a uint32 that orders as the floats do (a
 * negative's bits inverted, a positive's with the sign set, every NaN the largest key). One
 * pass keeps a min-heap of the k largest keys so far: a value enters only when its key is
 * above the heap's least, which in a row of any order but a rising one is rare once the heap
 * holds the first values (about k ln(V/k) entries in a random order), so the pass is mostly
 * a comparison a value, 8 at a time with AVX2 or one at a time portably (pick_nucleus). The
 * heap's least at the end is the k-th largest key, whose float is the k-th largest value bit
 * for bit (−0 and +0 have two keys but compare equal, so either threshold fills the same
 * places). A row of GPT-2's 50,257 with k = 40 takes about 6 µs with AVX2 (torch.topk and
 * its fill: about 250 µs a row). */
static inline uint32_t topk_key(float v) {
    const uint32_t u = nuc_bits(v);
    if (v != v)
        return UINT32_MAX;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline float topk_value(uint32_t key) {
    if (key == UINT32_MAX)
        return NAN;
    const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* key placed at i of the min-heap h[0..k) and sifted down (its subtrees already heaps). */
static inline void topk_sift(uint32_t *h, long long k, long long i, uint32_t key) {
    for (;;) {
        long long c = 2 * i + 1;
        if (c >= k)
            break;
        if (c + 1 < k && h[c + 1] < h[c])
            c++;
        if (h[c] >= key)
            break;
        h[i] = h[c], i = c;
    }
    h[i] = key;
}

/* The min-heap h[0..k) with its least replaced by key (> h[0]). */
static inline void topk_replace(uint32_t *h, long long k, uint32_t key) { topk_sift(h, k, 0, key); }

/* The first k keys of x as a min-heap in h. */
static void topk_heapify(const float *x, long long k, uint32_t *h) {
    for (long long i = 0; i < k; i++)
        h[i] = topk_key(x[i]);
    for (long long i = k / 2 - 1; i >= 0; i--)
        topk_sift(h, k, i, h[i]);
}

/* Pass: the keys of x[k..V) into the heap h of x[0..k)'s (k < V). */
typedef void (*TopkScanFn)(const float *x, long long V, long long k, uint32_t *h);

static void topk_scan_portable(const float *x, long long V, long long k, uint32_t *h) {
    for (long long i = k; i < V; i++) {
        const uint32_t key = topk_key(x[i]);
        if (key > h[0])
            topk_replace(h, k, key);
    }
}

#if GG_X86
/* topk_scan_portable, 8 values' keys at a time compared with the heap's least (as signed:
 * key ^ 2^31); the lanes above it, rare, enter one by one in index order. */
AVX2 static void topk_scan_avx2(const float *x, long long V, long long k, uint32_t *h) {
    long long i = k;
    for (; i < V && (i & 7); i++) { /* (to a multiple of 8: aligned with the row's start) */
        const uint32_t key = topk_key(x[i]);
        if (key > h[0])
            topk_replace(h, k, key);
    }
    __m256i least = _mm256_set1_epi32((int)(h[0] ^ 0x80000000u));
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i s = _mm256_castps_si256(v);
        /* the key as signed: s ^ (s < 0 ? 0x7fffffff : 0), and every NaN the largest */
        __m256i signed_key = _mm256_xor_si256(
            s, _mm256_and_si256(_mm256_srai_epi32(s, 31), _mm256_set1_epi32(0x7fffffff)));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        signed_key = _mm256_blendv_epi8(signed_key, _mm256_set1_epi32(0x7fffffff), nan);
        int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(signed_key, least)));
        if (!m)
            continue;
        for (; m; m &= m - 1) {
            const uint32_t key = topk_key(x[i + __builtin_ctz((unsigned)m)]);
            if (key > h[0])
                topk_replace(h, k, key);
        }
        least = _mm256_set1_epi32((int)(h[0] ^ 0x80000000u));
    }
    for (; i < V; i++) {
        const uint32_t key = topk_key(x[i]);
        if (key > h[0])
            topk_replace(h, k, key);
    }
}
#endif

static TopkScanFn TOPK_SCAN = topk_scan_portable;

static void pick_topk(int avx2) {
    TOPK_SCAN = topk_scan_portable;
#if GG_X86
    if (avx2)
        TOPK_SCAN = topk_scan_avx2;
#endif
    (void)avx2;
}

typedef struct {
    uint32_t *heap;
    long long capacity;
} TopkScratch;

/* Row z [V] with k (0 < k < V: else every value kept) into out; −1 where scratch could not
 * be had. */
static int top_k_row(const float *z, long long V, long long k, float *out, TopkScratch *s) {
    float t = -INFINITY;
    if (k > 0 && k < V) {
        if (k > s->capacity) {
            free(s->heap);
            s->heap = malloc((size_t)k * sizeof *s->heap);
            s->capacity = s->heap ? k : 0;
            if (!s->heap)
                return -1;
        }
        topk_heapify(z, k, s->heap);
        TOPK_SCAN(z, V, k, s->heap);
        t = topk_value(s->heap[0]);
    }
    for (long long i = 0; i < V; i++) /* a select the compiler vectorises */
        out[i] = z[i] < t ? -INFINITY : z[i];
    return 0;
}

typedef struct {
    const float *z;
    const long long *k;
    float *out;
    long long B, V;
    int failed; /* a part sets it; read after the join */
} TopkJob;

static void top_k_part(const void *arg, int part, int parts) {
    TopkJob *job = (TopkJob *)arg;
    static __thread TopkScratch *s; /* each thread's, kept across calls (and its capacity) */
    if (!s && !(s = calloc(1, sizeof *s))) {
        job->failed = 1;
        return;
    }
    int lo, hi;
    share((int)job->B, 1, part, parts, &lo, &hi);
    for (int b = lo; b < hi; b++)
        if (top_k_row(job->z + b * job->V, job->V, job->k[b], job->out + b * job->V, s) < 0)
            job->failed = 1;
}

/* top_k_fill(z, k, out, B, V, threads) → True with out [B, V] written (see top_k_row), False
 * where scratch could not be had. z float32 [B, V] contiguous, k int64 [B]. Rows in parts on
 * PyTorch's threads; a row's result does not depend on the parts. */
static PyObject *top_k_fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[6];
    if (!int_args(args, nargs, 6, a, "top_k_fill(z, k, out, B, V, threads)"))
        return NULL;
    if (a[3] < 0 || a[3] > INT32_MAX || a[4] <= 0) {
        PyErr_SetString(PyExc_ValueError, "top_k_fill: need 0 <= B < 2^31 and V > 0");
        return NULL;
    }
    TopkJob job = {(const float *)(uintptr_t)a[0], (const long long *)(uintptr_t)a[1],
                   (float *)(uintptr_t)a[2], a[3], a[4], 0};
    /* the GIL kept, as top_p_drop keeps it: a server's step waits to take it back from
     * whichever thread took it meanwhile, longer than this call takes (0.1 ms for 8 rows of
     * GPT-2's vocabulary at k 20-40) */
    run_parts(top_k_part, &job, part_count(a[5], (int)a[3]));
    return PyBool_FromLong(!job.failed);
}

/* draw_rows(probs, cdf, u, ids, B, V): the rest of sample.filters.draw after its softmax
 * and cumsum (float64 probs [B, V] and their cumsum, u [B] float64, ids [B] int64 written),
 * one call for PyTorch's eleven operations over a step's rows:
 *
 *     x = u_b · cdf[b, V − 1]                           (a float64 product)
 *     i = searchsorted(cdf[b], x, right=True)           PyTorch's binary search: the first
 *         clamped to V − 1                              i with cdf_i > x, by !(cdf_mid > x)
 *     where probs[b, i] = 0 (x rounded up to the total): the last i with probs > 0 (V − 1
 *     if none)
 *
 * The search is PyTorch's cus_upper_bound step for step, so a row with NaNs (where "sorted"
 * means nothing) ends where PyTorch's does. */
static PyObject *draw_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[6];
    if (!int_args(args, nargs, 6, a, "draw_rows(probs, cdf, u, ids, B, V)"))
        return NULL;
    if (a[4] < 0 || a[5] <= 0) {
        PyErr_SetString(PyExc_ValueError, "draw_rows: need B >= 0 and V > 0");
        return NULL;
    }
    const double *probs = (const double *)(uintptr_t)a[0], *cdf = (const double *)(uintptr_t)a[1];
    const double *u = (const double *)(uintptr_t)a[2];
    long long *ids = (long long *)(uintptr_t)a[3];
    const long long B = a[4], V = a[5];
    for (long long b = 0; b < B; b++) {
        const double *c = cdf + b * V, *p = probs + b * V;
        const double x = u[b] * c[V - 1];
        long long lo = 0, hi = V;
        while (lo < hi) {
            const long long mid = lo + ((hi - lo) >> 1);
            if (!(c[mid] > x))
                lo = mid + 1;
            else
                hi = mid;
        }
        long long i = lo < V - 1 ? lo : V - 1;
        if (p[i] == 0) {
            i = V - 1;
            for (long long j = V - 1; j >= 0; j--)
                if (p[j] > 0) {
                    i = j;
                    break;
                }
        }
        ids[b] = i;
    }
    Py_RETURN_NONE;
}

/* finite_rows(z, ok, B, V) → whether every row holds a finite value, with ok [B] (bytes 0/1)
 * written: torch.isfinite(z).any(-1) for float32 z [B, V] (contiguous). A row stops at its
 * first finite value (a logit row's first, almost always). */
static PyObject *finite_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[4];
    if (!int_args(args, nargs, 4, a, "finite_rows(z, ok, B, V)"))
        return NULL;
    if (a[2] < 0 || a[3] <= 0) {
        PyErr_SetString(PyExc_ValueError, "finite_rows: need B >= 0 and V > 0");
        return NULL;
    }
    const float *z = (const float *)(uintptr_t)a[0];
    uint8_t *ok = (uint8_t *)(uintptr_t)a[1];
    const long long B = a[2], V = a[3];
    int every = 1;
    for (long long b = 0; b < B; b++) {
        const float *row = z + b * V;
        uint8_t found = 0;
        for (long long i = 0; i < V && !found; i++)
            found = (nuc_bits(row[i]) & 0x7f800000u) != 0x7f800000u; /* not inf, not NaN */
        ok[b] = found;
        every &= found;
    }
    return PyBool_FromLong(every);
}

#endif
