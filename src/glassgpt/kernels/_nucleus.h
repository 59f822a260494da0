/* Top-p's drop mask without a sort of the vocabulary, for glassgpt's _rowwise extension:
 *
 *   top_p_drop(probs, p, drop, B, V, threads, z, out) → True, or False (nothing decided)
 *                              where a row holds a negative or infinite value; with z, out
 *                              (not 0) also out = z with −inf where dropped
 *   min_p_fill(z, log_m, out, B, V)   out = z with −inf where z_i − max z < log m_b (min-p,
 *                              the filter after top-p)
 *   (top_k_fill, draw_rows and finite_rows: _topk.h, included after this header)
 *
 * For each row of B float32 rows of V probabilities x (contiguous) and its float32 p, the
 * bits PyTorch's sorted form gives (sample.filters.top_p_filter):
 *
 *     s, order = sort(x, descending, stable)      ties keep ascending index order
 *     c_j = float(Σ_{i ≤ j} s_i)                  cumsum: a double accumulator, each output
 *                                                 rounded to float
 *     drop[order_j] = float(c_j − s_j) ≥ p        the mass before s_j, in float arithmetic
 *
 * A row holding a NaN sorts it first, so every c_j is NaN and nothing is dropped; so here.
 *
 * How, without sorting V values. A histogram of the values' bits (nonnegative floats order as
 * their bits) into buckets of 2^16 bit patterns, 128 an octave, from 2^-29 to 2, with one
 * bucket below 2^-29 and one from 2 up, holds each bucket's mass. Walking down the
 * buckets with G = the mass of the buckets above, a bucket whose G + mass < p − E keeps all
 * its values, one whose G ≥ p + E drops them all; only the few buckets between (the
 * candidates) are sorted, by a stable radix sort, and their c_j computed exactly as the
 * cumsum does, starting from G.
 *
 * Why that start is exact: floats ≥ 2^-29 are multiples of 2^-52, so while their total is
 * below 2, every partial sum of them is a double, whatever the order: the cumsum's
 * accumulator after the values of the buckets above (all ≥ 2^-29, a bucket's values being
 * smaller than every value above it) is exactly G. Past the start the candidates are added in
 * the sort's order, as the cumsum adds them (values below 2^-29 included, with their
 * roundings).
 *
 * Why E = 2^-20 is enough: float(c_j − s_j) is within 2^-23 of the exact mass before s_j (two
 * roundings to float below 2, ≤ 2^-24 each), and the accumulator and the bucket sums within
 * V · 2^-53 ≤ 2^-29 of exact sums (V < 2^24). A row whose total is 1.5 or more, or V ≥ 2^24,
 * sorts every value (the same sequence, no margin needed).
 *
 * The two passes over a row (the histogram; the drop bytes and the candidates) take 8
 * values at a time with AVX2, or a portable loop, picked by pick_nucleus: the same masks.
 * A row of GPT-2's 50,257 takes about 35-55 µs with AVX2 and 110 portable (against about
 * 2 ms for PyTorch's sort). Include once, from _rowwise.c (after _cpu.h, _parallel.h and
 * _module.h).
 */
#ifndef GLASSGPT_NUCLEUS_H
#define GLASSGPT_NUCLEUS_H

#define NUC_LOW 0x31000000u  /* 2^-29's bits: below, one bucket */
#define NUC_HIGH 0x40000000u /* 2's bits: from here, one bucket */
#define NUC_SHIFT 16
#define NUC_TOP ((int)(1 + ((NUC_HIGH - NUC_LOW) >> NUC_SHIFT))) /* the bucket from 2 up */
#define NUC_BUCKETS (NUC_TOP + 1)
#define NUC_MARGIN (1.0 / (1 << 20))

typedef struct {
    uint32_t key, at; /* the value's bits (sign cleared: −0 is 0), its index */
} NucValue;

#define NUC_WAYS 4 /* histograms, value i into i % 4: the adds to one bucket do not wait in turn */

typedef struct {
    double mass[NUC_WAYS][NUC_BUCKETS]; /* zero between rows (a row clears what it used) */
    NucValue *values, *spare; /* the candidates, and the radix sort's other buffer */
    size_t capacity;
} NucScratch;

/* The bucket of a value's bits with the sign cleared: 0 below 2^-29, NUC_TOP from 2 up (no
 * branches: in a peaked row, values above and below 2^-29 alternate unpredictably). */
static inline int nuc_bucket(uint32_t key) {
    const int b = 1 + (int)(key >> NUC_SHIFT) - (int)(NUC_LOW >> NUC_SHIFT);
    const int low = b < 0 ? 0 : b;
    return low > NUC_TOP ? NUC_TOP : low;
}

static inline uint32_t nuc_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* v[0..n) by key descending, equal keys in their present order: insertion for a few, else an
 * LSD radix sort on d = max − key, 8 bits a pass, as many passes as the keys' spread needs. */
static NucValue *nuc_sort(NucValue *v, NucValue *spare, size_t n) {
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            NucValue t = v[i];
            size_t j = i;
            for (; j > 0 && v[j - 1].key < t.key; j--)
                v[j] = v[j - 1];
            v[j] = t;
        }
        return v;
    }
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = v[i].key < lo ? v[i].key : lo;
        hi = v[i].key > hi ? v[i].key : hi;
    }
    const uint32_t spread = hi - lo;
    for (int shift = 0; shift < 32 && (spread >> shift); shift += 8) {
        size_t at[256] = {0};
        for (size_t i = 0; i < n; i++)
            at[((hi - v[i].key) >> shift) & 255]++;
        size_t sum = 0;
        for (int d = 0; d < 256; d++) {
            const size_t c = at[d];
            at[d] = sum, sum += c;
        }
        for (size_t i = 0; i < n; i++)
            spare[at[((hi - v[i].key) >> shift) & 255]++] = v[i];
        NucValue *t = v;
        v = spare, spare = t;
    }
    return v;
}

/* Pass 1: each value's mass into its bucket, value i into histogram i % NUC_WAYS; the
 * largest and smallest bits (as unsigned) into *most, *least. */
typedef void (*NucHistogramFn)(const float *x, long long V, double (*mass)[NUC_BUCKETS],
                               uint32_t *most, uint32_t *least);
/* Pass 2: drop[i] = bucket(x_i) < lo, and the candidates (buckets lo..hi; none where hi < lo)
 * into out in index order; returns their number. */
typedef size_t (*NucMarkFn)(const float *x, long long V, int lo, int hi, uint8_t *drop,
                            NucValue *out);

static void nuc_histogram_portable(const float *x, long long V, double (*mass)[NUC_BUCKETS],
                                   uint32_t *most, uint32_t *least) {
    uint32_t hi = *most, lo = *least;
    long long i = 0;
    for (; i + NUC_WAYS <= V; i += NUC_WAYS)
        for (int w = 0; w < NUC_WAYS; w++) {
            const uint32_t u = nuc_bits(x[i + w]);
            hi = u > hi ? u : hi, lo = u < lo ? u : lo;
            mass[w][nuc_bucket(u & 0x7fffffffu)] += (double)x[i + w];
        }
    for (; i < V; i++) {
        const uint32_t u = nuc_bits(x[i]);
        hi = u > hi ? u : hi, lo = u < lo ? u : lo;
        mass[0][nuc_bucket(u & 0x7fffffffu)] += (double)x[i];
    }
    *most = hi, *least = lo;
}

static size_t nuc_mark_portable(const float *x, long long V, int lo, int hi, uint8_t *drop,
                                NucValue *out) {
    size_t n = 0;
    if (hi < lo) { /* no candidates: a bucket is kept or dropped whole */
        for (long long i = 0; i < V; i++)
            drop[i] = nuc_bucket(nuc_bits(x[i]) & 0x7fffffffu) < lo;
        return 0;
    }
    const unsigned span = (unsigned)(hi - lo);
    for (long long i = 0; i < V; i++) {
        const uint32_t key = nuc_bits(x[i]) & 0x7fffffffu;
        const int b = nuc_bucket(key);
        drop[i] = b < lo;
        /* one unsigned comparison, rarely true: a branch the CPU predicts (a flat row's
         * values fall either side of the candidates at random: b < lo would not be) */
        if ((unsigned)(b - lo) <= span)
            out[n].key = key, out[n].at = (uint32_t)i, n++;
    }
    return n;
}

#if GG_X86
/* 8 values' buckets (nuc_bucket's, lanes of int32) from their bits. */
AVX2 static inline __m256i nuc_buckets8(__m256i bits) {
    const __m256i key = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i b = _mm256_sub_epi32(_mm256_srli_epi32(key, NUC_SHIFT),
                                       _mm256_set1_epi32((int)(NUC_LOW >> NUC_SHIFT) - 1));
    return _mm256_min_epi32(_mm256_max_epi32(b, _mm256_setzero_si256()),
                            _mm256_set1_epi32(NUC_TOP));
}

/* nuc_histogram_portable with the buckets and the extremes 8 lanes at a time (the adds to
 * the histograms stay one at a time, in the same histograms: the same sums). */
AVX2 static void nuc_histogram_avx2(const float *x, long long V, double (*mass)[NUC_BUCKETS],
                                    uint32_t *most, uint32_t *least) {
    __m256i hi = _mm256_set1_epi32((int)*most), lo = _mm256_set1_epi32((int)*least);
    long long i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x + i));
        hi = _mm256_max_epu32(hi, bits), lo = _mm256_min_epu32(lo, bits);
        int32_t b[8];
        _mm256_storeu_si256((__m256i *)b, nuc_buckets8(bits));
        for (int w = 0; w < 8; w++)
            mass[w % NUC_WAYS][b[w]] += (double)x[i + w];
    }
    uint32_t h[8], l[8];
    _mm256_storeu_si256((__m256i *)h, hi);
    _mm256_storeu_si256((__m256i *)l, lo);
    for (int w = 0; w < 8; w++)
        *most = h[w] > *most ? h[w] : *most, *least = l[w] < *least ? l[w] : *least;
    if (i < V) /* the tail into histogram 0 .. as the portable loop puts them */
        nuc_histogram_portable(x + i, V - i, mass, most, least);
}

/* nuc_mark_portable, 8 values at a time: the drop bytes from a comparison of the lanes'
 * buckets, the candidates (rare) from a mask. */
AVX2 static size_t nuc_mark_avx2(const float *x, long long V, int lo, int hi, uint8_t *drop,
                                 NucValue *out) {
    const __m256i vlo = _mm256_set1_epi32(lo);
    const __m256i span = _mm256_set1_epi32(hi < lo ? 0 : hi - lo);
    const int any = hi >= lo;
    size_t n = 0;
    long long i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256i b = nuc_buckets8(_mm256_loadu_si256((const __m256i *)(x + i)));
        const __m256i below = _mm256_cmpgt_epi32(vlo, b); /* −1 where b < lo */
        __m128i d = _mm_packs_epi32(_mm256_castsi256_si128(below),
                                    _mm256_extracti128_si256(below, 1));
        d = _mm_and_si128(_mm_packs_epi16(d, d), _mm_set1_epi8(1));
        _mm_storel_epi64((__m128i *)(drop + i), d);
        if (any) {
            const __m256i rel = _mm256_sub_epi32(b, vlo); /* as unsigned: ≤ span */
            const __m256i in = _mm256_cmpeq_epi32(_mm256_min_epu32(rel, span), rel);
            for (int m = _mm256_movemask_ps(_mm256_castsi256_ps(in)); m; m &= m - 1) {
                const int l = __builtin_ctz((unsigned)m);
                out[n].key = nuc_bits(x[i + l]) & 0x7fffffffu, out[n].at = (uint32_t)(i + l);
                n++;
            }
        }
    }
    if (i < V) {
        const size_t tail = nuc_mark_portable(x + i, V - i, lo, hi, drop + i, out + n);
        for (size_t j = n; j < n + tail; j++)
            out[j].at += (uint32_t)i;
        n += tail;
    }
    return n;
}
#endif

static NucHistogramFn NUC_HISTOGRAM = nuc_histogram_portable;
static NucMarkFn NUC_MARK = nuc_mark_portable;

static void pick_topk(int avx2);

static void pick_nucleus(int avx2) {
    NUC_HISTOGRAM = nuc_histogram_portable, NUC_MARK = nuc_mark_portable;
#if GG_X86
    if (avx2)
        NUC_HISTOGRAM = nuc_histogram_avx2, NUC_MARK = nuc_mark_avx2;
#endif
    pick_topk(avx2);
}

/* The drop mask of a row whose histogram is in s->mass[0] (buckets used_lo..
 * used_hi; `most`: the largest of its values' bits as unsigned); nucleus_row's status. */
static int nucleus_cut(const float *x, long long V, float p, uint8_t *drop, NucScratch *s,
                       int used_lo, int used_hi, uint32_t most) {
    if (most >= 0x7f800000u) { /* rare: a sign, an inf or a NaN. A NaN keeps every value; */
        int nan = 0, bad = 0;   /* refuse what is not a probability (−0 is one) */
        for (long long i = 0; i < V; i++)
            nan |= x[i] != x[i], bad |= x[i] < 0 || isinf(x[i]);
        if (nan) {
            memset(drop, 0, (size_t)V);
            return 0;
        }
        if (bad)
            return -1;
    }
    const double *mass = s->mass[0];
    double total = 0;
    for (int b = used_lo; b <= used_hi; b++)
        total += mass[b];
    int hi = NUC_TOP, lo = 0; /* candidates: buckets lo..hi; above kept, below dropped */
    double start = 0;        /* the mass of the buckets above hi */
    if (total < 1.5 && V < (1 << 24)) {
        const double keep_below = (double)p - NUC_MARGIN, drop_from = (double)p + NUC_MARGIN;
        double G = 0;
        /* an empty bucket (mass 0) is classified like any other: it holds nothing to
         * decide, and the walk's G does not change over it */
        for (hi = used_hi; hi >= used_lo; hi--) {
            if (G + mass[hi] >= keep_below)
                break;
            G += mass[hi];
        }
        start = G;
        lo = hi;
        for (; lo >= used_lo; lo--) {
            if (G >= drop_from)
                break;
            G += mass[lo];
        }
        lo++; /* lo − 1: the first bucket dropped whole, or below every value */
    }
    size_t n = hi >= lo ? (size_t)V : 0; /* room for every value */
    if (n > s->capacity) {
        free(s->values), free(s->spare);
        s->values = malloc(n * sizeof *s->values), s->spare = malloc(n * sizeof *s->spare);
        s->capacity = s->values && s->spare ? n : 0;
        if (!s->capacity)
            return -1;
    }
    n = NUC_MARK(x, V, lo, hi, drop, s->values);
    const NucValue *v = nuc_sort(s->values, s->spare, n);
    double acc = start;
    for (size_t j = 0; j < n; j++) {
        const float sj = x[v[j].at];
        acc += (double)sj;
        const float before = (float)acc - sj; /* PyTorch: cumsum (float) − sorted, in float */
        drop[v[j].at] = before >= p;
    }
    return 0;
}

/* One row's drop mask (0 or 1 a byte); 0, or −1 (nothing written) where the row holds a
 * negative or infinite value, or scratch could not be had. */
static int nucleus_row(const float *x, long long V, float p, uint8_t *drop, NucScratch *s) {
    uint32_t most = 0, least = UINT32_MAX; /* bits as unsigned: a sign, inf or NaN is > inf */
    NUC_HISTOGRAM(x, V, s->mass, &most, &least);
    /* the buckets used: least..most, or every one where a value has its sign bit */
    const int used_lo = most >= 0x80000000u ? 0 : nuc_bucket(least);
    const int used_hi = most >= 0x80000000u ? NUC_TOP : nuc_bucket(most);
    for (int w = 1; w < NUC_WAYS; w++)
        for (int b = used_lo; b <= used_hi; b++) {
            s->mass[0][b] += s->mass[w][b], s->mass[w][b] = 0;
        }
    const int status = nucleus_cut(x, V, p, drop, s, used_lo, used_hi, most);
    memset(s->mass[0] + used_lo, 0, (size_t)(used_hi - used_lo + 1) * sizeof s->mass[0][0]);
    return status;
}

typedef struct {
    const float *x, *p;
    uint8_t *drop;
    long long B, V;
    const float *z; /* with out: out = z, −inf where dropped (masked_fill's bits); or NULL */
    float *out;
    int failed; /* a part sets it; read after the join */
} NucleusJob;

static void nucleus_part(const void *arg, int part, int parts) {
    NucleusJob *job = (NucleusJob *)arg;
    static __thread NucScratch *s; /* each thread's, kept across calls (and its capacity) */
    if (!s && !(s = calloc(1, sizeof *s))) {
        job->failed = 1;
        return;
    }
    int lo, hi;
    share((int)job->B, 1, part, parts, &lo, &hi);
    for (int b = lo; b < hi; b++) {
        uint8_t *drop = job->drop + b * job->V;
        if (nucleus_row(job->x + b * job->V, job->V, job->p[b], drop, s) < 0) {
            job->failed = 1;
        } else if (job->z) { /* a select the compiler vectorises: no second PyTorch pass */
            const float *z = job->z + b * job->V;
            float *out = job->out + b * job->V;
            for (long long i = 0; i < job->V; i++)
                out[i] = drop[i] ? -INFINITY : z[i];
        }
    }
}

/* top_p_drop(probs, p, drop, B, V, threads, z, out) → True with drop [B, V] (bytes 0/1)
 * written (and, where z is not 0, out [B, V] = z with −inf where dropped), or False where
 * some row holds a negative or infinite value (then PyTorch's sort decides). Rows in parts on
 * PyTorch's threads; a row's mask does not depend on the parts. */
static PyObject *top_p_drop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[8];
    if (!int_args(args, nargs, 8, a, "top_p_drop(probs, p, drop, B, V, threads, z, out)"))
        return NULL;
    if (a[3] < 0 || a[3] > INT32_MAX || a[4] <= 0 || a[4] > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "top_p_drop: need 0 <= B < 2^31 and 0 < V < 2^32");
        return NULL;
    }
    NucleusJob job = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[1],
                      (uint8_t *)(uintptr_t)a[2], a[3], a[4], (const float *)(uintptr_t)a[6],
                      (float *)(uintptr_t)a[7], 0};
    run_parts(nucleus_part, &job, part_count(a[5], (int)a[3]));
    return PyBool_FromLong(!job.failed);
}

/* min_p_fill(z, log_m, out, B, V): out = z with −inf where z_i − max z < log m_b (float32
 * arithmetic, log m_b as PyTorch computed it: m_b = 0 gives −inf, nothing filled), the bits
 * of sample.rows._min_p's z.masked_fill(z − z.max() < log m, −inf), in one pass after the
 * maximum (PyTorch: a maximum and three passes). A row holding a NaN has a NaN maximum
 * there, and nothing compares true: it is copied. */
static PyObject *min_p_fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (!int_args(args, nargs, 5, a, "min_p_fill(z, log_m, out, B, V)"))
        return NULL;
    if (a[3] < 0 || a[4] <= 0) {
        PyErr_SetString(PyExc_ValueError, "min_p_fill: need B >= 0 and V > 0");
        return NULL;
    }
    const float *z = (const float *)(uintptr_t)a[0], *log_m = (const float *)(uintptr_t)a[1];
    float *out = (float *)(uintptr_t)a[2];
    const long long B = a[3], V = a[4];
    for (long long b = 0; b < B; b++) {
        const float *zb = z + b * V;
        float *ob = out + b * V, top = zb[0];
        int nan = 0;
        for (long long i = 0; i < V; i++)
            nan |= zb[i] != zb[i], top = zb[i] > top ? zb[i] : top;
        if (nan)
            top = NAN;
        const float cut = log_m[b];
        for (long long i = 0; i < V; i++) {
            const float d = zb[i] - top; /* rounded to float, as PyTorch's z − z_max */
            ob[i] = d < cut ? -INFINITY : zb[i];
        }
    }
    Py_RETURN_NONE;
}

#endif
