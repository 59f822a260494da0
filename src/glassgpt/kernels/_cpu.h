/* Which vector instructions glassgpt's float32 kernels may use, decided at run time.
 *
 * GG_X86: compiled for x86, where the AVX2 + FMA kernels exist; AVX2 marks a function
 * compiled for them; cpu_has_avx2() says whether this CPU runs them (else the portable
 * loops do). AVX512 and cpu_has_avx512() likewise for the few kernels that need AVX-512F's
 * 32 vector registers. Include once per extension.
 */
#ifndef GLASSGPT_CPU_H
#define GLASSGPT_CPU_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GG_X86 1
#define AVX2 __attribute__((target("avx2,fma")))

#define AVX512 __attribute__((target("avx512f,avx2,fma")))

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

__attribute__((unused)) static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f");
}
#else
#define GG_X86 0

static int cpu_has_avx2(void) { return 0; }
__attribute__((unused)) static int cpu_has_avx512(void) { return 0; }
#endif

#endif
