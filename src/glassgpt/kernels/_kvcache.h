/* A decoding step's writes to its KV cache, for glassgpt's _rowwise extension:
 *
 *   kv_write(K, V, k, v, B, H, T, D, n, strides)   K[:, :, n:n+T] = k, V[:, :, n:n+T] = v
 *   kv_write_rows(K, V, k, v, B, H, D, lengths, strides)   K[b, :, n_b] = k[b, :, 0] and the
 *                              same for V, n_b = lengths[b] (int64, read when it runs)
 *   advance(lengths, B, T)     lengths[b] += T for b < B (int64)
 *
 * strides: a tuple of 16 ints, the (b, h, t, d) strides of K, V, k and v. One thread, the
 * GIL held (a few rows). Include once, from _rowwise.c (after _module.h).
 */
#ifndef GLASSGPT_KVCACHE_H
#define GLASSGPT_KVCACHE_H

/* K[b, h, n_b + t, :] = k[b, h, t, :] and the same for V and v (ptr: K, V, k, v), with
 * n_b = lengths[b] where lengths are given, else n; s: the (b, h, t, d) strides of K, V, k, v. */
static void write_kv(const long long *ptr, long long B, long long H, long long T, long long D,
                     long long n, const long long *lengths, const long long *s) {
    for (int m = 0; m < 2; m++) { /* K from k, then V from v */
        float *dst = (float *)(uintptr_t)ptr[m];
        const float *src = (const float *)(uintptr_t)ptr[2 + m];
        const long long *sd = s + 4 * m, *ss = s + 8 + 4 * m;
        for (long long b = 0; b < B; b++) {
            const long long at = lengths ? lengths[b] : n;
            for (long long h = 0; h < H; h++)
                for (long long t = 0; t < T; t++) {
                    float *to = dst + b * sd[0] + h * sd[1] + (at + t) * sd[2];
                    const float *from = src + b * ss[0] + h * ss[1] + t * ss[2];
                    if (sd[3] == 1 && ss[3] == 1)
                        memcpy(to, from, sizeof(float) * (size_t)D);
                    else
                        for (long long d = 0; d < D; d++)
                            to[d * sd[3]] = from[d * ss[3]];
                }
        }
    }
}

/* kv_write(K, V, k, v, B, H, T, D, n, strides): K[b, h, n + t, :] = k[b, h, t, :] and the
 * same for V and v, strides a tuple of 16 ints: (b, h, t, d) of K, V, k and v. */
static int kv_write_impl(const long long *a, const double *unused, KernelError *err) {
    if (a[9] != 16)
        return kernel_fail(err, KERR_TYPE, "kv_write(K, V, k, v, B, H, T, D, n, 16 strides)");
    if (a[4] < 0 || a[5] < 0 || a[6] < 0 || a[7] < 0 || a[8] < 0)
        return kernel_fail(err, KERR_VALUE, "kv_write: negative size or position");
    write_kv(a, a[4], a[5], a[6], a[7], a[8], NULL, a + 10);
    return 0;
}

static const KernelEntry KV_WRITE = {"kv_write", "iiiiiiiiit", kv_write_impl, 0,
                                     "kv_write(K, V, k, v, B, H, T, D, n, 16 strides)"};

FASTCALL_ENTRY(kv_write, KV_WRITE)

/* kv_write_rows(K, V, k, v, B, H, D, lengths, strides): K[b, h, n_b, :] = k[b, h, 0, :] and
 * the same for V and v, n_b = lengths[b]; strides as kv_write's. */
static int kv_write_rows_impl(const long long *a, const double *unused, KernelError *err) {
    if (a[8] != 16)
        return kernel_fail(err, KERR_TYPE, "kv_write_rows(K, V, k, v, B, H, D, lengths, 16 strides)");
    write_kv(a, a[4], a[5], 1, a[6], 0, (const long long *)(uintptr_t)a[7], a + 9);
    return 0;
}

static const KernelEntry KV_WRITE_ROWS = {"kv_write_rows", "iiiiiiiit", kv_write_rows_impl, 0,
                                          "kv_write_rows(K, V, k, v, B, H, D, lengths, 16 strides)"};

FASTCALL_ENTRY(kv_write_rows, KV_WRITE_ROWS)

/* advance(lengths, B, T): lengths[b] += T for b < B, int64. */
static int advance_impl(const long long *a, const double *unused, KernelError *err) {
    long long *lengths = (long long *)(uintptr_t)a[0];
    for (long long b = 0; b < a[1]; b++)
        lengths[b] += a[2];
    return 0;
}

static const KernelEntry ADVANCE = {"advance", "iii", advance_impl, 0,
                                    "expected advance(lengths, B, T)"};

FASTCALL_ENTRY(advance, ADVANCE)

#endif
