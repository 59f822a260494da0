/* glassgpt.kernels._program: a replayed decoding step's recorded calls run as one compiled
 * call (kernels/program.py).
 *
 * A replayed step is a fixed list of kernel calls, (fn, args, positional): the same
 * functions on the same buffers at every step, with the arguments named in `positional`
 * moved by the position n. Run from Python, each call takes the GIL back when its kernel
 * returns, and waits there for whichever thread took it meanwhile (a server's event loop,
 * its prompt thread). Here each call is packed once: the implementation the kernel's own
 * entry point calls (found in its extension's `_impls` capsule by name, kernels/_program.h),
 * its argument slots as that entry point parses them, and the slots that move with n. A run
 * lets go of the GIL once, makes every call in order, and takes it back once. A call with no
 * C implementation (a Python callable, say PyTorch's tanh of a soft cap) is made from Python
 * between two such segments, with its positions moved as the Python replay moves them.
 *
 * Python API:
 *   build(calls) → a program (a capsule): calls a list of (fn, args, positional)
 *   run(program, n)   every call, positions + n; an implementation's error raises the
 *                     exception and message its entry point raises
 *   names(program) → each call's kernel name, None for a Python call
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_program.h"

#define PROGRAM_NAME "glassgpt.kernels._program.Program"

typedef struct {
    const KernelEntry *entry; /* NULL: a Python call */
    long long iv[SLOT_INTS];  /* the slots at position 0 */
    double dv[SLOT_DOUBLES];
    int npos, pos[SLOT_ARGS]; /* the integer slots that move with n */
    PyObject *fn, *args, *positional; /* a Python call (new references) */
} Step;

typedef struct {
    Py_ssize_t count;
    Step *steps;
} Program;

static void free_program(PyObject *capsule) {
    Program *p = PyCapsule_GetPointer(capsule, PROGRAM_NAME);
    if (!p)
        return;
    for (Py_ssize_t i = 0; i < p->count; i++)
        Py_XDECREF(p->steps[i].fn), Py_XDECREF(p->steps[i].args),
            Py_XDECREF(p->steps[i].positional);
    PyMem_Free(p->steps);
    PyMem_Free(p);
}

/* fn's entry in its module's `_impls` table, or NULL (no error set) where it has none. */
static const KernelEntry *find_entry(PyObject *fn) {
    if (!PyCFunction_Check(fn))
        return NULL;
    PyObject *module = PyCFunction_GET_SELF(fn);
    if (!module || !PyModule_Check(module))
        return NULL;
    PyObject *cap = PyObject_GetAttrString(module, "_impls");
    if (!cap) {
        PyErr_Clear();
        return NULL;
    }
    const KernelEntry *const *table = PyCapsule_IsValid(cap, PROGRAM_CAPSULE)
                                          ? PyCapsule_GetPointer(cap, PROGRAM_CAPSULE)
                                          : NULL;
    Py_DECREF(cap);
    const char *name = ((PyCFunctionObject *)fn)->m_ml->ml_name;
    for (; table && *table; table++)
        if (strcmp((*table)->name, name) == 0)
            return *table;
    return NULL;
}

/* Packs one recorded call into s; 0 with an error set. */
static int pack_step(Step *s, PyObject *call) {
    if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) != 3 ||
        !PyTuple_Check(PyTuple_GET_ITEM(call, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(call, 2))) {
        PyErr_SetString(PyExc_TypeError, "build: each call is (fn, args tuple, positional tuple)");
        return 0;
    }
    PyObject *fn = PyTuple_GET_ITEM(call, 0), *args = PyTuple_GET_ITEM(call, 1);
    PyObject *positional = PyTuple_GET_ITEM(call, 2);
    const Py_ssize_t nargs = PyTuple_GET_SIZE(args), npos = PyTuple_GET_SIZE(positional);
    s->entry = find_entry(fn);
    if (!s->entry || nargs > SLOT_ARGS || npos > SLOT_ARGS) { /* made from Python */
        s->entry = NULL;
        Py_INCREF(fn), Py_INCREF(args), Py_INCREF(positional);
        s->fn = fn, s->args = args, s->positional = positional;
        return 1;
    }
    int where[SLOT_ARGS];
    if (!flatten(s->entry, &PyTuple_GET_ITEM(args, 0), nargs, s->iv, s->dv, where))
        return 0;
    s->npos = (int)npos;
    for (Py_ssize_t j = 0; j < npos; j++) {
        const Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(positional, j));
        if (a == -1 && PyErr_Occurred())
            return 0;
        if (a < 0 || a >= nargs || where[a] < 0) {
            PyErr_Format(PyExc_ValueError, "build: %s's argument %zd is not an integer position",
                         s->entry->name, a);
            return 0;
        }
        s->pos[j] = where[a];
    }
    return 1;
}

static PyObject *build(PyObject *self, PyObject *calls) {
    PyObject *seq = PySequence_Fast(calls, "build(calls): a list of (fn, args, positional)");
    if (!seq)
        return NULL;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    Program *p = PyMem_Calloc(1, sizeof(Program));
    Step *steps = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(Step));
    if (!p || !steps) {
        PyMem_Free(p), PyMem_Free(steps), Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    p->steps = steps;
    PyObject *capsule = PyCapsule_New(p, PROGRAM_NAME, free_program);
    if (!capsule) {
        PyMem_Free(p), PyMem_Free(steps), Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++, p->count++)
        if (!pack_step(&steps[i], PySequence_Fast_GET_ITEM(seq, i))) {
            Py_DECREF(seq), Py_DECREF(capsule);
            return NULL;
        }
    Py_DECREF(seq);
    return capsule;
}

/* fn(*args) with the arguments at `positional` moved by n: the Python replay's call. */
static int call_python(const Step *s, long long n) {
    PyObject *args = s->args;
    const Py_ssize_t npos = PyTuple_GET_SIZE(s->positional), size = PyTuple_GET_SIZE(args);
    if (npos) { /* a fresh tuple (a whole slice would be the recorded one itself) */
        PyObject *by = PyLong_FromLongLong(n);
        args = by ? PyTuple_New(size) : NULL;
        if (!args) {
            Py_XDECREF(by);
            return 0;
        }
        for (Py_ssize_t j = 0; j < size; j++)
            PyTuple_SET_ITEM(args, j, Py_NewRef(PyTuple_GET_ITEM(s->args, j)));
        for (Py_ssize_t j = 0; j < npos; j++) {
            const Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(s->positional, j));
            PyObject *moved = a < 0 || a >= size ? NULL
                                                 : PyNumber_Add(PyTuple_GET_ITEM(args, a), by);
            if (!moved) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_IndexError, "run: no argument %zd to move", a);
                Py_DECREF(args), Py_DECREF(by);
                return 0;
            }
            Py_SETREF(((PyTupleObject *)args)->ob_item[a], moved); /* ours: made above */
        }
        Py_DECREF(by);
    }
    PyObject *out = PyObject_Call(s->fn, args, NULL);
    if (npos)
        Py_DECREF(args);
    Py_XDECREF(out);
    return out != NULL;
}

/* The compiled calls steps[lo, hi) with positions + n, the GIL released; the index of a
 * failed call (err set), else hi. */
static Py_ssize_t run_segment(const Step *steps, Py_ssize_t lo, Py_ssize_t hi, long long n,
                              KernelError *err) {
    long long moved[SLOT_INTS];
    for (Py_ssize_t i = lo; i < hi; i++) {
        const Step *s = &steps[i];
        const long long *iv = s->iv;
        if (s->npos) {
            memcpy(moved, s->iv, sizeof moved);
            for (int j = 0; j < s->npos; j++)
                moved[s->pos[j]] += n;
            iv = moved;
        }
        if (s->entry->impl(iv, s->dv, err) < 0)
            return i;
    }
    return hi;
}

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "run(program, n)");
        return NULL;
    }
    const Program *p = PyCapsule_GetPointer(args[0], PROGRAM_NAME);
    const long long n = p ? PyLong_AsLongLong(args[1]) : 0;
    if (!p || (n == -1 && PyErr_Occurred()))
        return NULL;
    const Step *steps = p->steps;
    for (Py_ssize_t i = 0; i < p->count;) {
        if (!steps[i].entry) {
            if (!call_python(&steps[i], n))
                return NULL;
            i++;
            continue;
        }
        Py_ssize_t end = i;
        while (end < p->count && steps[end].entry)
            end++;
        KernelError err = {KERR_NONE, {0}};
        Py_ssize_t done;
        Py_BEGIN_ALLOW_THREADS
        done = run_segment(steps, i, end, n, &err);
        Py_END_ALLOW_THREADS
        if (done < end)
            return raise_kernel_error(&err);
        i = end;
    }
    Py_RETURN_NONE;
}

static PyObject *names(PyObject *self, PyObject *capsule) {
    const Program *p = PyCapsule_GetPointer(capsule, PROGRAM_NAME);
    if (!p)
        return NULL;
    PyObject *out = PyList_New(p->count);
    for (Py_ssize_t i = 0; out && i < p->count; i++) {
        PyObject *name = p->steps[i].entry ? PyUnicode_FromString(p->steps[i].entry->name)
                                           : Py_NewRef(Py_None);
        if (!name) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, name);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"build", build, METH_O, "build(calls) -> a program of the recorded (fn, args, positional)"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(program, n): every call with its positions moved by n, the GIL let go once a segment"},
    {"names", names, METH_O, "names(program) -> each call's kernel name, None for a Python call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_program",
                                    "A replayed decoding step's calls as one compiled call.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__program(void) { return PyModule_Create(&module); }
