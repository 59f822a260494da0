/* A replayed decoding step's residual stream, for glassgpt's _rowwise extension:
 *
 *   embed(W_E, tokens, P or 0, y, B, d, n_vocab, pos, positions or 0)   y[b] = W_E[tokens[b]]
 *                              + P[pos] (+ P[positions[b]] where int64 positions are given),
 *                              the step's first residual (tokens int64; ValueError out of range)
 *   add(a, b, y, n)            y = a + b over n values (the step's residual sums)
 *
 * One thread, the GIL held. Include once, from _rowwise.c (after _module.h).
 */
#ifndef GLASSGPT_RESIDUAL_H
#define GLASSGPT_RESIDUAL_H

/* add(a, b, y, n): y = a + b elementwise over n float32 values. */
static int add_impl(const long long *a, const double *unused, KernelError *err) {
    const float *x = (const float *)(uintptr_t)a[0], *z = (const float *)(uintptr_t)a[1];
    float *y = (float *)(uintptr_t)a[2];
    for (long long i = 0; i < a[3]; i++)
        y[i] = x[i] + z[i];
    return 0;
}

static const KernelEntry ADD = {"add", "iiii", add_impl, 0, "expected add(a, b, y, n)"};

FASTCALL_ENTRY(add, ADD)

/* embed(W_E, tokens, P or 0, y, B, d, n_vocab, pos, positions or 0): y[b, :] =
 * W_E[tokens[b], :] (+ P[p_b, :], p_b = positions[b] if given, else pos) for B int64 tokens,
 * each checked against n_vocab. */
static int embed_impl(const long long *a, const double *unused, KernelError *err) {
    const long long *positions = (const long long *)(uintptr_t)a[8];
    const float *W = (const float *)(uintptr_t)a[0], *P = (const float *)(uintptr_t)a[2];
    const long long *tokens = (const long long *)(uintptr_t)a[1];
    float *y = (float *)(uintptr_t)a[3];
    const long long B = a[4], d = a[5], n_vocab = a[6], pos = a[7];
    for (long long b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= n_vocab)
            return kernel_fail(err, KERR_VALUE,
                               "tokens: id %lld is out of range [0, %lld) for n_vocab=%lld",
                               tokens[b], n_vocab, n_vocab);
    for (long long b = 0; b < B; b++) {
        const long long at = positions ? positions[b] : pos;
        const float *row = W + tokens[b] * d, *p = P ? P + at * d : NULL;
        float *out = y + b * d;
        for (long long i = 0; i < d; i++)
            out[i] = p ? row[i] + p[i] : row[i];
    }
    return 0;
}

static const KernelEntry EMBED = {"embed", "iiiiiiiii", embed_impl, 0,
                                  "expected embed(W_E, tokens, P, y, B, d, n_vocab, pos, positions)"};

FASTCALL_ENTRY(embed, EMBED)

#endif
