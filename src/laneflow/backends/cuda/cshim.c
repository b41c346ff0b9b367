/* laneflow's per-command driver calls, straight into libcuda (backends/cuda/cshim.py builds this file
 * with the system C compiler, once per user and Python, and backends/cuda/fastcall.py uses it when it
 * loads).
 *
 * Why: through cuda-bindings, a cuLaunchKernel costs about 6 us of host time on the H200's host (the
 * typed wrapper converts its eleven arguments and builds a result tuple), ctypes more. Here each call is
 * one METH_FASTCALL function that reads plain ints (or objects with __index__, as cuda-bindings'
 * handles are), calls the driver without the GIL (a launch may block on a full queue) and returns the CUresult
 * as an int. The driver is opened with dlopen by name, so no CUDA header is needed to build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>

typedef int CUresult;
typedef void *P;

static CUresult (*p_launch)(P, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, P, P *, P *);
static CUresult (*p_record)(P, P);
static CUresult (*p_query)(P);
static CUresult (*p_wait)(P, P, unsigned);
static CUresult (*p_alloc)(unsigned long long *, size_t, P, P);
static CUresult (*p_free)(unsigned long long, P);
static CUresult (*p_dtod)(unsigned long long, unsigned long long, size_t, P);
static CUresult (*p_htod)(unsigned long long, const void *, size_t, P);

#define NOT_INITIALIZED 3 /* CUDA_ERROR_NOT_INITIALIZED: init() has not opened a driver */

/* An unsigned 64-bit value from an int, or from an object with __index__ (a cuda-bindings handle); a
 * float or a negative number is refused. */
static int u64(PyObject *o, unsigned long long *v) {
    if (PyLong_Check(o)) {
        *v = PyLong_AsUnsignedLongLong(o);
    } else {
        PyObject *i = PyNumber_Index(o);
        if (i == NULL)
            return -1;
        *v = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
    }
    return (*v == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

static int u32(PyObject *o, unsigned *v) {
    unsigned long long w;
    if (u64(o, &w))
        return -1;
    if (w > UINT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a launch dimension or size does not fit 32 bits");
        return -1;
    }
    *v = (unsigned)w;
    return 0;
}

static int nargs_is(Py_ssize_t n, Py_ssize_t want, const char *name) {
    if (n == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, n);
    return -1;
}

/* The call's arguments, all unsigned 64-bit values, into v[0..want). */
static int parse(PyObject *const *a, Py_ssize_t n, Py_ssize_t want, const char *name, unsigned long long *v) {
    if (nargs_is(n, want, name))
        return -1;
    for (Py_ssize_t i = 0; i < want; i++)
        if (u64(a[i], &v[i]))
            return -1;
    return 0;
}

/* Call the driver entry point fp (expr calls it) without the GIL and return its CUresult. */
#define CALL(fp, expr)                                                                                  \
    do {                                                                                                \
        if (fp == NULL)                                                                                 \
            return PyLong_FromLong(NOT_INITIALIZED);                                                    \
        CUresult r_;                                                                                    \
        Py_BEGIN_ALLOW_THREADS r_ = expr;                                                               \
        Py_END_ALLOW_THREADS return PyLong_FromLong(r_);                                                \
    } while (0)

/* launch(f, gx, gy, gz, bx, by, bz, smem, stream, argv) -> CUresult; argv: the address of the kernel's
 * parameter pointer array (kernels/launch.py packs it). */
static PyObject *launch(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long f, s, argv;
    unsigned d[7];
    if (nargs_is(n, 10, "launch") || u64(a[0], &f))
        return NULL;
    for (int i = 0; i < 7; i++)
        if (u32(a[1 + i], &d[i]))
            return NULL;
    if (u64(a[8], &s) || u64(a[9], &argv))
        return NULL;
    CALL(p_launch, p_launch((P)f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], (P)s, (P *)argv, NULL));
}

/* record(event, stream) -> CUresult */
static PyObject *record(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[2];
    if (parse(a, n, 2, "record", v))
        return NULL;
    CALL(p_record, p_record((P)v[0], (P)v[1]));
}

/* query(event) -> CUresult (0 done, 600 not ready) */
static PyObject *query(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[1];
    if (parse(a, n, 1, "query", v))
        return NULL;
    CALL(p_query, p_query((P)v[0]));
}

/* wait_event(stream, event) -> CUresult */
static PyObject *wait_event(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[2];
    if (parse(a, n, 2, "wait_event", v))
        return NULL;
    CALL(p_wait, p_wait((P)v[0], (P)v[1], 0));
}

/* alloc(nbytes, pool, stream) -> (CUresult, pointer or 0) */
static PyObject *alloc(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[3], ptr = 0;
    if (parse(a, n, 3, "alloc", v))
        return NULL;
    CUresult r = NOT_INITIALIZED;
    if (p_alloc != NULL) {
        Py_BEGIN_ALLOW_THREADS
        r = p_alloc(&ptr, (size_t)v[0], (P)v[1], (P)v[2]);
        Py_END_ALLOW_THREADS
    }
    return Py_BuildValue("(iK)", r, r ? 0ULL : ptr);
}

/* free(pointer, stream) -> CUresult */
static PyObject *free_(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[2];
    if (parse(a, n, 2, "free", v))
        return NULL;
    CALL(p_free, p_free(v[0], (P)v[1]));
}

/* copy_dtod(dst, src, nbytes, stream) -> CUresult */
static PyObject *copy_dtod(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[4];
    if (parse(a, n, 4, "copy_dtod", v))
        return NULL;
    CALL(p_dtod, p_dtod(v[0], v[1], (size_t)v[2], (P)v[3]));
}

/* copy_htod(dst, host address, nbytes, stream) -> CUresult */
static PyObject *copy_htod(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long v[4];
    if (parse(a, n, 4, "copy_htod", v))
        return NULL;
    CALL(p_htod, p_htod(v[0], (const void *)(uintptr_t)v[1], (size_t)v[2], (P)v[3]));
}

/* init(library) -> None: opens the driver library (libcuda.so.1; a test's stand-in) and finds the
 * entry points cuda.h maps the calls to (the _v2 copies). Raises OSError naming what is missing. */
static PyObject *init(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (nargs_is(n, 1, "init") || !PyUnicode_Check(a[0])) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "init takes the driver library's name or path");
        return NULL;
    }
    const char *lib = PyUnicode_AsUTF8(a[0]);
    if (lib == NULL)
        return NULL;
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        PyErr_Format(PyExc_OSError, "dlopen(%s): %s", lib, dlerror());
        return NULL;
    }
    static const char *names[] = {"cuLaunchKernel", "cuEventRecord", "cuEventQuery", "cuStreamWaitEvent",
                                  "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuMemcpyDtoDAsync_v2",
                                  "cuMemcpyHtoDAsync_v2"};
    void *found[8];
    for (int i = 0; i < 8; i++) {
        found[i] = dlsym(h, names[i]);
        if (found[i] == NULL) {
            PyErr_Format(PyExc_OSError, "%s has no %s", lib, names[i]);
            dlclose(h);
            return NULL;
        }
    }
    p_launch = found[0];
    p_record = found[1];
    p_query = found[2];
    p_wait = found[3];
    p_alloc = found[4];
    p_free = found[5];
    p_dtod = found[6];
    p_htod = found[7];
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)(void (*)(void))init, METH_FASTCALL, "init(library): open the driver"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(f, gx, gy, gz, bx, by, bz, smem, stream, argv) -> CUresult"},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL, "record(event, stream) -> CUresult"},
    {"query", (PyCFunction)(void (*)(void))query, METH_FASTCALL, "query(event) -> CUresult"},
    {"wait_event", (PyCFunction)(void (*)(void))wait_event, METH_FASTCALL, "wait_event(stream, event) -> CUresult"},
    {"alloc", (PyCFunction)(void (*)(void))alloc, METH_FASTCALL, "alloc(nbytes, pool, stream) -> (CUresult, ptr)"},
    {"free", (PyCFunction)(void (*)(void))free_, METH_FASTCALL, "free(ptr, stream) -> CUresult"},
    {"copy_dtod", (PyCFunction)(void (*)(void))copy_dtod, METH_FASTCALL,
     "copy_dtod(dst, src, nbytes, stream) -> CUresult"},
    {"copy_htod", (PyCFunction)(void (*)(void))copy_htod, METH_FASTCALL,
     "copy_htod(dst, host_address, nbytes, stream) -> CUresult"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_laneflow_cshim", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__laneflow_cshim(void) { return PyModule_Create(&module); }
