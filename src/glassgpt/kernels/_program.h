/* A kernel's C implementation apart from its Python entry point, for a replayed step run as
 * one compiled call (kernels/_program.c).
 *
 * Each kernel that a replayed decoding step records is two parts: its entry point, which
 * parses the Python arguments into flat slots (integers and doubles, by the kernel's
 * `format`), and its implementation, which computes from the slots and touches no Python
 * object (so that it runs with the GIL released: errors come back in a KernelError). The
 * entry point and the program call the same implementation, so they compute the same bits.
 *
 * format, one character an argument:
 *   i  an integer (an address, a size; PyLong_AsLongLong)
 *   o  an integer that is 1 where left out (below)
 *   b  a truth value (PyObject_IsTrue), an integer slot
 *   d  a float (PyFloat_AsDouble), a double slot
 *   t  a tuple of integers: its length, then its items, in integer slots
 *   |  the arguments after it may be left out (integers 0, doubles 0.0, a tuple of none)
 *
 * Each extension exports its table of KernelEntry pointers, ended by NULL, as the
 * capsule `_impls` (PROGRAM_CAPSULE), which the program looks up by the function's name.
 * Include after <Python.h>, once per extension.
 */
#ifndef GLASSGPT_PROGRAM_H
#define GLASSGPT_PROGRAM_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PROGRAM_CAPSULE "glassgpt.kernels._impls"
#define SLOT_INTS 64    /* the most integer slots of one call */
#define SLOT_DOUBLES 8  /* the most double slots of one call */
#define SLOT_ARGS 24    /* the most arguments of one call */

enum { KERR_NONE, KERR_VALUE, KERR_TYPE, KERR_MEMORY };

typedef struct {
    int kind; /* KERR_*: the exception to raise */
    char msg[240];
} KernelError;

/* Computes from the slots (no Python object, the GIL held or not); 0, or -1 with err set. */
typedef int (*KernelImpl)(const long long *i, const double *d, KernelError *err);

typedef struct {
    const char *name;   /* the Python function's name */
    const char *format; /* its arguments (above) */
    KernelImpl impl;
    int release;        /* whether the entry point lets go of the GIL while it runs */
    const char *usage;  /* the TypeError's message on a wrong count of arguments */
} KernelEntry;

/* -1 with err holding `kind` and the formatted message. */
__attribute__((unused, format(printf, 3, 4))) static int kernel_fail(KernelError *err, int kind,
                                                                     const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->kind = kind;
    return -1;
}

/* The Python exception of err (NULL, for a caller's return). */
__attribute__((unused)) static PyObject *raise_kernel_error(const KernelError *err) {
    if (err->kind == KERR_MEMORY)
        return PyErr_NoMemory();
    PyErr_SetString(err->kind == KERR_TYPE ? PyExc_TypeError : PyExc_ValueError, err->msg);
    return NULL;
}

/* args[0..nargs) into the slots by k's format; where (if not NULL) gets each argument's
 * first integer slot (-1 for a double). 0 with a Python error set on bad arguments. */
__attribute__((unused)) static int flatten(const KernelEntry *k, PyObject *const *args,
                                           Py_ssize_t nargs, long long *iv, double *dv,
                                           int *where) {
    const char *f = k->format;
    Py_ssize_t need = 0, least = -1;
    for (const char *c = f; *c; c++)
        if (*c == '|')
            least = need;
        else
            need++;
    if (nargs > need || nargs < (least < 0 ? need : least) || nargs > SLOT_ARGS) {
        PyErr_SetString(PyExc_TypeError, k->usage);
        return 0;
    }
    int ni = 0, nd = 0;
    Py_ssize_t a = 0;
    for (const char *c = f; *c; c++) {
        if (*c == '|')
            continue;
        PyObject *x = a < nargs ? args[a] : NULL;
        if (where)
            where[a] = *c == 'd' ? -1 : ni;
        a++;
        if (*c == 'd') {
            if (nd >= SLOT_DOUBLES)
                goto too_many;
            dv[nd] = x ? PyFloat_AsDouble(x) : 0.0;
            if (dv[nd++] == -1.0 && PyErr_Occurred())
                return 0;
            continue;
        }
        if (*c == 't') {
            if (x && !PyTuple_Check(x)) {
                PyErr_SetString(PyExc_TypeError, k->usage);
                return 0;
            }
            const Py_ssize_t n = x ? PyTuple_GET_SIZE(x) : 0;
            if (ni + 1 + n > SLOT_INTS)
                goto too_many;
            iv[ni++] = n;
            for (Py_ssize_t j = 0; j < n; j++) {
                iv[ni] = PyLong_AsLongLong(PyTuple_GET_ITEM(x, j));
                if (iv[ni++] == -1 && PyErr_Occurred())
                    return 0;
            }
            continue;
        }
        if (ni >= SLOT_INTS)
            goto too_many;
        if (*c == 'b') {
            const int on = x ? PyObject_IsTrue(x) : 0;
            if (on < 0)
                return 0;
            iv[ni++] = on;
        } else {
            iv[ni] = x ? PyLong_AsLongLong(x) : *c == 'o';
            if (iv[ni++] == -1 && PyErr_Occurred())
                return 0;
        }
    }
    return 1;
too_many:
    PyErr_Format(PyExc_ValueError, "%s: too many arguments for one call", k->name);
    return 0;
}

/* Runs an implementation from slots already parsed: the GIL released where k says. */
__attribute__((unused)) static PyObject *run_slots(const KernelEntry *k, const long long *iv,
                                                   const double *dv) {
    KernelError err = {KERR_NONE, {0}};
    int rc;
    if (k->release) {
        Py_BEGIN_ALLOW_THREADS
        rc = k->impl(iv, dv, &err);
        Py_END_ALLOW_THREADS
    } else {
        rc = k->impl(iv, dv, &err);
    }
    if (rc < 0)
        return raise_kernel_error(&err);
    Py_RETURN_NONE;
}

/* A METH_FASTCALL entry point: the arguments by k's format, then its implementation. */
__attribute__((unused)) static PyObject *run_entry(const KernelEntry *k, PyObject *const *args,
                                                   Py_ssize_t nargs) {
    long long iv[SLOT_INTS];
    double dv[SLOT_DOUBLES];
    if (!flatten(k, args, nargs, iv, dv, NULL))
        return NULL;
    return run_slots(k, iv, dv);
}

/* A METH_FASTCALL entry point `name` that parses its arguments by `entry` and runs it. */
#define FASTCALL_ENTRY(name, entry)                                                      \
    static PyObject *name(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {      \
        return run_entry(&(entry), args, nargs);                                          \
    }

/* Adds the table (ended by NULL) to module m as its `_impls` capsule; m or NULL. */
__attribute__((unused)) static PyObject *export_impls(PyObject *m,
                                                      const KernelEntry *const *table) {
    if (!m)
        return NULL;
    PyObject *cap = PyCapsule_New((void *)table, PROGRAM_CAPSULE, NULL);
    if (!cap || PyModule_AddObject(m, "_impls", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#endif
