/* y = x σ(x) = x / (1 + e^{−x}) over n float32 values, elementwise, shared by the _rowwise
 * extension's silu and the _gemv extension's gated products (gemv_panels_glu), so that the
 * two give the same bits: silu_avx2 with exp8 (_vexp.h), a few float32 ulps from libm's expf
 * in silu_portable. Each value's result depends on that value alone (the AVX2 loop's tail
 * is computed in a padded block of 8), so any split of a row gives the same bits.
 * Include after _cpu.h and, on x86, _vexp.h.
 */
#ifndef GLASSGPT_SILU_H
#define GLASSGPT_SILU_H

#include <math.h>

typedef void (*SiluFn)(const float *x, float *y, long long n);

static void silu_portable(const float *x, float *y, long long n) {
    for (long long i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

#if GG_X86
AVX2 static void silu_avx2(const float *x, float *y, long long n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    long long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
    if (i < n) {
        float in[8] = {0}, out[8];
        for (long long j = i; j < n; j++)
            in[j - i] = x[j];
        silu_avx2(in, out, 8);
        for (long long j = i; j < n; j++)
            y[j] = out[j - i];
    }
}
#endif

#endif
