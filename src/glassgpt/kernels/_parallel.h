/* Parallel parts on PyTorch's own OpenMP threads, for glassgpt's compiled kernels.
 *
 * The parts run on the OpenMP runtime that PyTorch itself loaded (found among the loaded
 * libraries, called through its GOMP_parallel entry point, which GNU, LLVM and Intel OpenMP
 * all export), so that PyTorch's threads and these are the same threads: two pools on the
 * same cores would spin against each other. Without one, the parts run one after another.
 *
 * A parallel run only pays while the other threads get their cores. When another process
 * keeps a core busy, a worker waits for a time slice and the caller waits for it at the
 * join: a product that takes 0.3 ms alone then takes several ms (a GPT-2-small decoding
 * step on 2 cores went from 21 ms to 400 ms with one core busy). So run_parts times each
 * parallel run against the caller's own part: when recent runs took longer, on average, than
 * their parts would have taken one after another, the following runs take the parts one
 * after another on the caller for a while, then try the threads again, waiting longer after
 * each failed try (SOLO_MIN_NS doubling up to SOLO_MAX_NS). A late join now and then (a busy
 * host) does not stop the threads; a core held by another process does. Every part computes
 * the same thing either way, so results do not depend on which way they ran. The pacing is
 * one for the process, shared by every extension that includes this header (pacing_state).
 *
 * Finding the runtime: on Linux, among the loaded libraries (dl_iterate_phdr, as PyTorch
 * loads its libgomp privately); on macOS and the BSDs, by name among every loaded image
 * (dlsym(RTLD_DEFAULT): PyTorch's libomp exports the GOMP_ entry points too); elsewhere, or
 * where none is found, the parts run one after another.
 *
 * Include once per extension; needs _GNU_SOURCE before the first system header.
 */
#ifndef GLASSGPT_PARALLEL_H
#define GLASSGPT_PARALLEL_H

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define SOLO_MIN_NS 20000000LL   /* parts one after another for 20 ms after a slow run, */
#define SOLO_MAX_NS 1000000000LL /* doubling while the threads stay slow, up to 1 s */

typedef void (*PartFn)(const void *job, int part, int parts);
typedef void (*GompParallel)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
typedef int (*OmpInt)(void);

static GompParallel gomp_parallel;
static OmpInt omp_thread_num;

#if defined(__linux__)
#include <link.h>

static int find_openmp(struct dl_phdr_info *info, size_t size, void *found) {
    const char *name = info->dlpi_name;
    (void)size;
    if (!name || !(strstr(name, "gomp") || strstr(name, "iomp") || strstr(name, "libomp")))
        return 0;
    void *lib = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib)
        return 0;
    gomp_parallel = (GompParallel)dlsym(lib, "GOMP_parallel");
    omp_thread_num = (OmpInt)dlsym(lib, "omp_get_thread_num");
    *(int *)found = gomp_parallel && omp_thread_num;
    return *(int *)found;
}
#endif

/* Whether an OpenMP runtime is loaded (looked for once, after PyTorch is imported). */
static int openmp_ready(void) {
    static int state = -1;
    if (state < 0) {
        int found = 0;
#if defined(__linux__)
        dl_iterate_phdr(find_openmp, &found);
#elif defined(RTLD_DEFAULT)
        gomp_parallel = (GompParallel)dlsym(RTLD_DEFAULT, "GOMP_parallel");
        omp_thread_num = (OmpInt)dlsym(RTLD_DEFAULT, "omp_get_thread_num");
        found = gomp_parallel && omp_thread_num;
#endif
        state = found;
    }
    return state;
}

typedef struct {
    PartFn fn;
    const void *job;
    int parts;
    int64_t own_ns; /* how long the caller (thread 0) took over its part */
} Parallel;

static int64_t clock_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void parallel_body(void *arg) {
    Parallel *p = arg;
    int part = omp_thread_num();
    if (part == 0) {
        int64_t t0 = clock_ns();
        p->fn(p->job, 0, p->parts);
        p->own_ns = clock_ns() - t0;
    } else if (part < p->parts) {
        p->fn(p->job, part, p->parts);
    }
}

/* Whether parallel runs have been paying: gain = the caller's part times the parts (what
 * running them one after another would have taken, about) minus what the run took, averaged
 * over recent runs. While that average is negative the parts run on the caller (until
 * solo_until). Races between callers only blur the average; every part is computed either way.
 *
 * The first parallel run after a solo window is judged apart: the workers spun out and slept
 * during the window, and waking them is that run's cost, not a held core's. Judged with the
 * rest, it began the next window whatever the host did, so that once one window began they
 * doubled to a second each and the process kept to one thread to its end. It now begins
 * the next window only if it lost more than WAKE_NS (a held core costs a time slice: the
 * first parallel 576×960 float32 product after 50 ms idle took 1.4-5.7 ms on this host under
 * load, against 24-30 µs for the next; waking an idle core takes tens of µs), and otherwise
 * leaves the average to the runs after it. */
#define WAKE_NS 1000000LL /* 1 ms */

typedef struct {
    int64_t solo_until, solo_span, gain;
    int paying_runs, retry; /* retry: the next parallel run is the first after a window */
    int64_t parallel, solo, windows; /* runs each way, and solo windows begun (counts) */
} Pacing;

/* One pacing for the process. Whether the other cores are free is the host's state, not one
 * extension's: a decoding step's products (_gemv) and its attention (_attend) run on the same
 * threads one after another, so a verdict that the products reached must hold for the
 * attention too (with a pacing each, the attention kept trying its threads while the
 * products had gone to one: a parallel run of 9 heads took 36-45 µs against 28 on one thread
 * with the other core held). Every extension that includes this header exports its own
 * Pacing under one name; all of them use the first loaded one's, found in load order (as the
 * OpenMP runtime is found, since Python loads extensions privately). */
#define PACING_SYMBOL "glassgpt_pacing_v1"
__attribute__((visibility("default"))) Pacing glassgpt_pacing_v1 = {0, SOLO_MIN_NS, 0, 0, 0,
                                                                      0, 0, 0};
static Pacing *pacing_shared;

#if defined(__linux__)
static int find_pacing(struct dl_phdr_info *info, size_t size, void *found) {
    const char *name = info->dlpi_name;
    (void)size;
    if (!name || !strstr(name, "glassgpt"))
        return 0;
    void *lib = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib)
        return 0;
    *(Pacing **)found = (Pacing *)dlsym(lib, PACING_SYMBOL);
    dlclose(lib);
    return *(Pacing **)found != NULL;
}
#endif

/* The process's pacing (this extension's own where no earlier one is found). Looked up once;
 * two threads racing here find the same one. */
static Pacing *pacing_state(void) {
    if (!pacing_shared) {
        Pacing *found = NULL;
#if defined(__linux__)
        dl_iterate_phdr(find_pacing, &found);
#elif defined(RTLD_DEFAULT)
        found = (Pacing *)dlsym(RTLD_DEFAULT, PACING_SYMBOL);
#endif
        pacing_shared = found ? found : &glassgpt_pacing_v1;
    }
    return pacing_shared;
}

static void pace(int64_t start, int64_t end, int64_t own, int parts) {
    Pacing *pacing = pacing_state();
    int64_t gain = own * parts - (end - start);
    if (pacing->retry) {
        pacing->retry = 0;
        if (gain >= -WAKE_NS)
            return;
        pacing->gain = -1; /* a held core still: the next window */
    } else {
        if (gain < -own * parts) /* one stall counts as one lost run, however long it was */
            gain = -own * parts;
        pacing->gain += (gain - pacing->gain) / 8; /* an average over ~8 runs */
    }
    if (pacing->gain >= 0) {
        if (++pacing->paying_runs >= 64) /* the threads have been fine a while: short solos */
            pacing->solo_span = SOLO_MIN_NS;
        return;
    }
    pacing->solo_until = end + pacing->solo_span;
    pacing->windows++;
    pacing->solo_span =
        pacing->solo_span * 2 < SOLO_MAX_NS ? pacing->solo_span * 2 : SOLO_MAX_NS;
    pacing->gain = 0; /* the next parallel run starts a fresh average */
    pacing->retry = 1;
    pacing->paying_runs = 0;
}

/* fn(job, part, parts) for every part: in parallel where an OpenMP runtime is loaded and
 * its threads have been getting their cores, else one after another on the caller. */
static void run_parts(PartFn fn, const void *job, int parts) {
    if (parts > 1 && openmp_ready()) {
        Pacing *pacing = pacing_state();
        int64_t start = clock_ns();
        if (start >= pacing->solo_until) {
            Parallel p = {fn, job, parts, 0};
            gomp_parallel(parallel_body, &p, (unsigned)parts, 0);
            int64_t end = clock_ns();
            pace(start, end, p.own_ns, parts);
            pacing->parallel++;
            return;
        }
        pacing->solo++;
    }
    for (int part = 0; part < parts; part++)
        fn(job, part, parts);
}

/* [lo, hi): part p of `parts` of n items, in whole groups of `align`. */
static inline void share(int n, int align, int part, int parts, int *lo, int *hi) {
    int groups = (n + align - 1) / align;
    int g0 = (int)((long long)groups * part / parts);
    int g1 = (int)((long long)groups * (part + 1) / parts);
    *lo = g0 * align < n ? g0 * align : n;
    *hi = g1 * align < n ? g1 * align : n;
}

#endif
