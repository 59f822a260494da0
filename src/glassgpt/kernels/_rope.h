/* A decoding step's rotary embedding and gated MLP, for glassgpt's _rowwise extension:
 *
 *   rope(x, cos, sin, y, B, heads, D, r, sb, sh, cs)   y[b, h] = x[b, h] with each pair
 *                      (a, b) = (x_2i, x_2i+1), 2i < r, rotated: (a c − b s, a s + b c),
 *                      c, s = cos[b, i], sin[b, i] (row b at b·cs: cs = 0 broadcasts one row);
 *                      x's rows at b·sb + h·sh (unit stride along D), y contiguous [B, heads, D]
 *   take_rows(table, y, B, d, pos, positions or 0)   y[b] = table[p_b] (p_b = positions[b],
 *                      or pos): a replayed step's cos and sin rows at the moving position
 *   silu(x, y, n)      y = x σ(x) = x / (1 + e^{−x})
 *   mul(a, b, y, n)    y = a ⊙ b (the gated MLP's product)
 *
 * The rotation rounds each product, then the sum (no fused multiply-add): the bits of
 * PyTorch's pair-by-pair form (its complex product fuses some multiply-adds: an ulp away). silu with AVX2 + FMA takes exp8 (_vexp.h), a few float32 ulps
 * from libm's expf in the portable loop; both differ from PyTorch's F.silu in rounding only.
 * One thread, the GIL held. Include once, from _rowwise.c (after _silu.h and _module.h).
 */
#ifndef GLASSGPT_ROPE_H
#define GLASSGPT_ROPE_H

/* No AVX2/FMA target on this function: the compiler cannot contract a·c − b·s into one
 * fused multiply-add. */
static void rope_rows(const float *x, const float *cs_cos, const float *cs_sin, float *y,
                      long long B, long long H, long long D, long long r, long long sb,
                      long long sh, long long cs) {
    for (long long b = 0; b < B; b++) {
        const float *c = cs_cos + b * cs, *s = cs_sin + b * cs;
        for (long long h = 0; h < H; h++) {
            const float *xi = x + b * sb + h * sh;
            float *yo = y + (b * H + h) * D;
            for (long long i = 0; 2 * i < r; i++) {
                const float a = xi[2 * i], e = xi[2 * i + 1];
                const float ac = a * c[i], es = e * s[i], as = a * s[i], ec = e * c[i];
                yo[2 * i] = ac - es;
                yo[2 * i + 1] = as + ec;
            }
            for (long long j = r; j < D; j++)
                yo[j] = xi[j];
        }
    }
}

static int rope_impl(const long long *a, const double *unused, KernelError *err) {
    rope_rows((const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[1],
              (const float *)(uintptr_t)a[2], (float *)(uintptr_t)a[3], a[4], a[5], a[6], a[7],
              a[8], a[9], a[10]);
    return 0;
}

static const KernelEntry ROPE = {"rope", "iiiiiiiiiii", rope_impl, 0,
                                 "expected rope(x, cos, sin, y, B, heads, D, r, sb, sh, cs)"};

FASTCALL_ENTRY(rope, ROPE)

static int take_rows_impl(const long long *a, const double *unused, KernelError *err) {
    const float *table = (const float *)(uintptr_t)a[0];
    float *y = (float *)(uintptr_t)a[1];
    const long long *positions = (const long long *)(uintptr_t)a[5];
    for (long long b = 0; b < a[2]; b++) {
        const long long at = positions ? positions[b] : a[4];
        memcpy(y + b * a[3], table + at * a[3], sizeof(float) * (size_t)a[3]);
    }
    return 0;
}

static const KernelEntry TAKE_ROWS = {"take_rows", "iiiiii", take_rows_impl, 0,
                                      "expected take_rows(table, y, B, d, pos, positions)"};

FASTCALL_ENTRY(take_rows, TAKE_ROWS)

static SiluFn SILU = silu_portable;

static void pick_rope(int avx2) {
    SILU = silu_portable;
#if GG_X86
    if (avx2)
        SILU = silu_avx2;
#endif
}

static int silu_impl(const long long *a, const double *unused, KernelError *err) {
    SILU((const float *)(uintptr_t)a[0], (float *)(uintptr_t)a[1], a[2]);
    return 0;
}

static const KernelEntry SILU_ENTRY = {"silu", "iii", silu_impl, 0, "expected silu(x, y, n)"};

FASTCALL_ENTRY(silu, SILU_ENTRY)

static int mul_impl(const long long *a, const double *unused, KernelError *err) {
    const float *x = (const float *)(uintptr_t)a[0], *z = (const float *)(uintptr_t)a[1];
    float *y = (float *)(uintptr_t)a[2];
    for (long long i = 0; i < a[3]; i++)
        y[i] = x[i] * z[i];
    return 0;
}

static const KernelEntry MUL = {"mul", "iiii", mul_impl, 0, "expected mul(a, b, y, n)"};

FASTCALL_ENTRY(mul, MUL)

#endif
