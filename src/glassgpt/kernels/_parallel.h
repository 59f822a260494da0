/* Parallel parts on PyTorch's own OpenMP threads, for glassgpt's compiled kernels.
 *
 * The parts run on the OpenMP runtime that PyTorch itself loaded (found among the loaded
 * libraries, called through its GOMP_parallel entry point, which GNU, LLVM and Intel OpenMP
 * all export), so that PyTorch's threads and these are the same threads: two pools on the
 * same cores would spin against each other. Without one, the parts run one after another.
 *
 * Include once per extension; needs _GNU_SOURCE before the first system header.
 */
#ifndef GLASSGPT_PARALLEL_H
#define GLASSGPT_PARALLEL_H

#include <dlfcn.h>
#include <link.h>
#include <string.h>

typedef void (*PartFn)(const void *job, int part, int parts);
typedef void (*GompParallel)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
typedef int (*OmpInt)(void);

static GompParallel gomp_parallel;
static OmpInt omp_thread_num;

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

/* Whether an OpenMP runtime is loaded (looked for once, after PyTorch is imported). */
static int openmp_ready(void) {
    static int state = -1;
    if (state < 0) {
        int found = 0;
        dl_iterate_phdr(find_openmp, &found);
        state = found;
    }
    return state;
}

typedef struct {
    PartFn fn;
    const void *job;
    int parts;
} Parallel;

static void parallel_body(void *arg) {
    const Parallel *p = arg;
    int part = omp_thread_num();
    if (part < p->parts)
        p->fn(p->job, part, p->parts);
}

/* fn(job, part, parts) for every part, in parallel where an OpenMP runtime is loaded. */
static void run_parts(PartFn fn, const void *job, int parts) {
    if (parts > 1 && openmp_ready()) {
        Parallel p = {fn, job, parts};
        gomp_parallel(parallel_body, &p, (unsigned)parts, 0);
        return;
    }
    for (int part = 0; part < parts; part++)
        fn(job, part, parts);
}

/* [lo, hi): part p of `parts` of n items, in whole groups of `align`. */
static void share(int n, int align, int part, int parts, int *lo, int *hi) {
    int groups = (n + align - 1) / align;
    int g0 = (int)((long long)groups * part / parts);
    int g1 = (int)((long long)groups * (part + 1) / parts);
    *lo = g0 * align < n ? g0 * align : n;
    *hi = g1 * align < n ? g1 * align : n;
}

#endif
