/* What a kernel extension's Python side shares: integer arguments, and the two entry points
 * by which tests see and switch the kernels in use.
 *
 * Include after the extension's `pick_kernels(int portable)` and `KERNEL_NAME` (the name of
 * the kernels picked: "avx2" or "portable"), and after <Python.h>. Include once per extension.
 */
#ifndef GLASSGPT_MODULE_H
#define GLASSGPT_MODULE_H

/* The integer arguments args[0..n) into out (addresses, sizes); False with an error set. */
static int ints(PyObject *const *args, Py_ssize_t n, long long *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred())
            return 0;
    }
    return 1;
}

/* Exactly n integer arguments into out; False with a TypeError naming `usage` otherwise. */
__attribute__((unused)) static int int_args(PyObject *const *args, Py_ssize_t nargs,
                                            Py_ssize_t n, long long *out, const char *usage) {
    if (nargs != n) {
        PyErr_Format(PyExc_TypeError, "expected %s", usage);
        return 0;
    }
    return ints(args, n, out);
}

/* use_portable(flag): force the portable loops (tests only: no call may be in flight). */
static PyObject *use_portable(PyObject *self, PyObject *flag) {
    int on = PyObject_IsTrue(flag);
    if (on < 0)
        return NULL;
    pick_kernels(on);
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(KERNEL_NAME);
}

#endif
