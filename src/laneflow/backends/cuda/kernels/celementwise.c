/* The elementwise kernel's common launch in C (kernels/celementwise.py loads it; dispatch.py's KERNELS
   maps "elementwise" to it when it loads).

   ew(lane, prim, ins, outs) launches what elementwise.run launches for an array and an array, or an
   array and a Python scalar (x + y, x + 1.0: elementwise.run's unrolled form), from a plan that
   elementwise.py already made: the same plan key, the same kernel (the vector one where every pointer
   it loads or stores is aligned), grid and arguments, packed by the kernel's own struct into its
   parameter block (Kernel.launch) and launched through the kernel's own driver call. Anything else (an
   integer power, other operands, a comparison with a scalar, a plan or a kernel not made yet, a kernel
   with Dims parameters, a scalar of another type) goes to elementwise.elementwise, which makes the plan
   or the kernel, so the next launch of that key comes here.

   Why: an uncached command's kernel launch was five Python frames (elementwise, run, the plan's kernel
   choice, Kernel.launch, the driver call's wrapper). */

#include "../../../native.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

static PyObject *plans, *python_ew, *failed, *compare, *to_f32;
static PyTypeObject *scalar_t, *array_t, *pair_t, *plan_t, *kernel_t;
/* DeviceArray's, KernelPair's, _Plan's, Kernel's and Scalar's slots that the launch reads */
static const char *const A_SLOTS[] = {"ptr", "shape", "dtype", "size"};
enum { A_PTR, A_SHAPE, A_DTYPE, A_SIZE, A_N };
static const char *const K2_SLOTS[] = {"kern", "vspec", "vkern", "vptrs"};
enum { K2_KERN, K2_VSPEC, K2_VKERN, K2_VPTRS, K2_N };
static const char *const PL_SLOTS[] = {"steps", "grid", "tail", "vgrid", "vtail"};
enum { PL_STEPS, PL_GRID, PL_TAIL, PL_VGRID, PL_VTAIL, PL_N };
static const char *const KN_SLOTS[] = {"name", "_pack", "_block", "_argv_addr", "_dims", "_launch", "_f", "params",
                                       "_argv"};
enum { KN_NAME, KN_PACK, KN_BLOCK, KN_ARGV, KN_DIMS, KN_LAUNCH, KN_F, KN_PARAMS, KN_ARGV_ARRAY, KN_N };
static Py_ssize_t a_off[A_N], k2_off[K2_N], pl_off[PL_N], kn_off[KN_N], value_off;
static PyObject *s_fn, *s_operands, *s_ctx, *s_handle, *s_power;
static PyObject *zero, *one, *block_x;
static const char *const PRIM_ATTRS[] = {"fn", "operands"};
static const char *const LANE_ATTRS[] = {"ctx", "handle"};
static Plain prim_plain = {PRIM_ATTRS, 2, 0, {0}}, lane_plain = {LANE_ATTRS, 2, 0, {0}};

/* A small memo of plans by their key's parts (what elementwise.py's _plans is keyed by): the dtypes, the
   scalar's type, the function name and the context compared by identity, the shapes by value. It holds a
   reference to every part, so an identity it compares was not reused by another object; a miss looks the
   plan up in _plans. Why: the key's three tuples and the dtypes' hashes cost about 0.2 us a launch on the
   CPU VM. A plan stays valid for its key when _plans is emptied (plan.keep): it is the same plan. */
#define MEMO_N 16
typedef struct { PyObject *fn, *ta, *tb, *sa, *sb, *so, *dto, *ctx, *plan; } Memo;
static Memo memo[MEMO_N];
static uintptr_t memo_mask = MEMO_N - 1;  /* (memo_slots: tests use one slot, where every key collides) */

static void memo_set(Memo *m, PyObject *const *v) {
    PyObject **f[9] = {&m->fn, &m->ta, &m->tb, &m->sa, &m->sb, &m->so, &m->dto, &m->ctx, &m->plan};
    PyObject *old[9];
    for (int k = 0; k < 9; k++) {  /* (all set before any old part goes: a finalizer may run then) */
        old[k] = *f[k];
        *f[k] = Py_XNewRef(v[k]);
    }
    for (int k = 0; k < 9; k++)
        Py_XDECREF(old[k]);
}

static void memo_clear(void) {
    static PyObject *const none[9] = {NULL};
    for (int k = 0; k < MEMO_N; k++)
        memo_set(&memo[k], none);
}

/* equal shapes (tuples of ints: no Python code runs): 1, else 0 */
static int same_shape(PyObject *x, PyObject *y) {
    if (x == y)
        return 1;
    if (x == NULL || y == NULL || !PyTuple_CheckExact(x) || !PyTuple_CheckExact(y) ||
        PyTuple_GET_SIZE(x) != PyTuple_GET_SIZE(y))
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(x); k++) {
        PyObject *i = PyTuple_GET_ITEM(x, k), *j = PyTuple_GET_ITEM(y, k);
        if (i == j)
            continue;
        if (!PyLong_CheckExact(i) || !PyLong_CheckExact(j))
            return 0;
        int eq = PyObject_RichCompareBool(i, j, Py_EQ);
        if (eq != 1) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* init(plans dict, elementwise.elementwise, failed(kernel, err), comparisons, Scalar, DeviceArray,
        KernelPair, _Plan, Kernel, elementwise._to_f32) */
static PyObject *init(PyObject *self, PyObject *args) {
    PyObject *p, *e, *f, *c, *tf;
    PyTypeObject *st, *at, *kt2, *pt, *kt;
    Py_ssize_t ao[A_N], k2o[K2_N], plo[PL_N], kno[KN_N], vo;
    if (!PyArg_ParseTuple(args, "O!OOOO!O!O!O!O!O", &PyDict_Type, &p, &e, &f, &c, &PyType_Type, &st, &PyType_Type,
                          &at, &PyType_Type, &kt2, &PyType_Type, &pt, &PyType_Type, &kt, &tf))
        return NULL;
    if (!PyAnySet_Check(c)) {
        PyErr_SetString(PyExc_TypeError, "celementwise: the comparisons are a set");
        return NULL;
    }
    if (offsets_of(at, A_SLOTS, A_N, ao) || offsets_of(kt2, K2_SLOTS, K2_N, k2o) ||
        offsets_of(pt, PL_SLOTS, PL_N, plo) || offsets_of(kt, KN_SLOTS, KN_N, kno) || offset_of(st, "value", &vo))
        return NULL;
    if (!PyType_IsSubtype(pt, kt2)) {
        PyErr_SetString(PyExc_TypeError, "celementwise: _Plan is not a KernelPair");
        return NULL;
    }
#define INTERN(v, t) if (v == NULL && (v = PyUnicode_InternFromString(t)) == NULL) return NULL
    INTERN(s_fn, "fn"); INTERN(s_operands, "operands"); INTERN(s_ctx, "ctx"); INTERN(s_handle, "handle");
    INTERN(s_power, "power");
#undef INTERN
    if ((zero == NULL && (zero = PyLong_FromLong(0)) == NULL) || (one == NULL && (one = PyLong_FromLong(1)) == NULL) ||
        (block_x == NULL && (block_x = PyLong_FromLong(256)) == NULL))
        return NULL;
    memcpy(a_off, ao, sizeof ao);
    memcpy(k2_off, k2o, sizeof k2o);
    memcpy(pl_off, plo, sizeof plo);
    memcpy(kn_off, kno, sizeof kno);
    value_off = vo;
    memo_clear();  /* (its plans were another dict's) */
    Py_XSETREF(plans, Py_NewRef(p));
    Py_XSETREF(python_ew, Py_NewRef(e));
    Py_XSETREF(failed, Py_NewRef(f));
    Py_XSETREF(compare, Py_NewRef(c));
    Py_XSETREF(to_f32, Py_NewRef(tf));
    Py_XSETREF(scalar_t, (PyTypeObject *)Py_NewRef(st));
    Py_XSETREF(array_t, (PyTypeObject *)Py_NewRef(at));
    Py_XSETREF(pair_t, (PyTypeObject *)Py_NewRef(kt2));
    Py_XSETREF(plan_t, (PyTypeObject *)Py_NewRef(pt));
    Py_XSETREF(kernel_t, (PyTypeObject *)Py_NewRef(kt));
    Py_RETURN_NONE;
}

/* elementwise._py_type for the exact built-in scalar types (borrowed); NULL: another type */
static PyObject *py_type(PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyFloat_Type || t == &PyLong_Type || t == &PyBool_Type || t == &PyComplex_Type)
        return (PyObject *)t;
    return NULL;
}

static int is_array(PyObject *x) {  /* a DeviceArray (or a subclass) with its four slots set */
    if (!PyObject_TypeCheck(x, array_t))
        return 0;
    for (int k = 0; k < A_N; k++)
        if (SLOT(x, a_off[k]) == NULL)
            return 0;
    return 1;
}

static int aligned(PyObject *arr) {  /* arr.ptr % 16 == 0: 1, 0; -1 when the pointer is not an int */
    PyObject *p = SLOT(arr, a_off[A_PTR]);
    if (!PyLong_Check(p))
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLongMask(p);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return (v & 15) == 0;
}

/* The kernel's n parameters written straight into its block, each at its address in the kernel's pointer
   array (Kernel._argv), as its struct's pack_into writes them: 1 written, 0 not (a parameter code or a
   value of a type this does not take, or one out of its type's range: the caller packs with the struct,
   which writes the whole block again, or raises what it raises). Pointers and integers must be exact
   ints, floats exact floats but NaN (a float rounded to a C float as struct's "f" rounds it, and refused
   where struct raises: finite, but beyond a C float's range). The padding between parameters is left
   as it is (zero: nothing else writes the block).
   Why: struct.pack_into through numpy's buffer protocol was a tenth of an uncached add's host time (the
   fake driver, py-spy). */
static int pack_direct(PyObject *kern, PyObject *const *vals, Py_ssize_t n) {
    PyObject *params = SLOT(kern, kn_off[KN_PARAMS]);
    if (params == NULL || !PyUnicode_CheckExact(params) || !PyUnicode_IS_ASCII(params) ||
        PyUnicode_GET_LENGTH(params) != n)
        return 0;
    /* (the pointer array was made for the codes the kernel was built with: a kernel whose params were
       reassigned since is left to its struct, which refuses a wrong count) */
    if (PyObject_Length(SLOT(kern, kn_off[KN_ARGV_ARRAY])) != n) {
        PyErr_Clear();
        return 0;
    }
    const char *codes = (const char *)PyUnicode_1BYTE_DATA(params);
    const unsigned long long *argv = PyLong_AsVoidPtr(SLOT(kern, kn_off[KN_ARGV]));
    if (argv == NULL)
        goto refuse;
    /* (a refusal part way leaves some parameters written: the caller's pack_into writes them all again) */
    for (Py_ssize_t j = 0; j < n; j++) {
        void *at = (void *)(uintptr_t)argv[j];
        PyObject *v = vals[j];
        char c = codes[j];
        if (c == 'f' || c == 'd') {  /* (a NaN goes to the struct: how it packs a signalling NaN is the version's) */
            if (!PyFloat_CheckExact(v) || isnan(PyFloat_AS_DOUBLE(v)))
                return 0;
            double d = PyFloat_AS_DOUBLE(v);
            if (c == 'd') {
                memcpy(at, &d, 8);
                continue;
            }
            float f = (float)d;
            if (isinf(f) && !isinf(d))
                return 0;  /* (struct raises OverflowError: the caller's pack_into raises it) */
            memcpy(at, &f, 4);
            continue;
        }
        if (!PyLong_CheckExact(v))
            return 0;
        if (c == 'p' || c == 'Q') {
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred())
                goto refuse;
            memcpy(at, &u, 8);
            continue;
        }
        long long q = PyLong_AsLongLong(v);
        if (q == -1 && PyErr_Occurred())
            goto refuse;
        if (c == 'q') {
            memcpy(at, &q, 8);
        } else if (c == 'i' && q >= INT32_MIN && q <= INT32_MAX) {
            int32_t i = (int32_t)q;
            memcpy(at, &i, 4);
        } else if (c == 'I' && q >= 0 && q <= UINT32_MAX) {
            uint32_t i = (uint32_t)q;
            memcpy(at, &i, 4);
        } else {
            return 0;  /* (another code, or out of its range) */
        }
    }
    return 1;
refuse:
    PyErr_Clear();
    return 0;
}

/* The launch of `plan` (a _Plan, referenced by the caller) for out = fn(a, b or value): as fast() */
static int with_plan(PyObject *plan, PyObject *ins, PyObject *out, PyObject *a, PyObject *b, PyObject *value,
                     PyObject *handle) {
    /* _Plan.kernel: the vector kernel where every pointer it loads or stores as a vector is aligned */
    int vec = 0;
    PyObject *vspec = SLOT(plan, k2_off[K2_VSPEC]);
    if (vspec != NULL && vspec != Py_None) {
        vec = aligned(out);
        PyObject *vptrs = SLOT(plan, k2_off[K2_VPTRS]);
        if (vec < 0 || vptrs == NULL || !PyTuple_CheckExact(vptrs))
            return 0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(vptrs) && vec == 1; j++) {
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(vptrs, j));
            if (k < 0 || k >= PyList_GET_SIZE(ins) || !is_array(PyList_GET_ITEM(ins, k))) {
                PyErr_Clear();
                return 0;
            }
            vec = aligned(PyList_GET_ITEM(ins, k));
        }
        if (vec < 0)
            return 0;
    }
    PyObject *kern = SLOT(plan, vec ? k2_off[K2_VKERN] : k2_off[K2_KERN]);
    PyObject *grid = SLOT(plan, vec ? pl_off[PL_VGRID] : pl_off[PL_GRID]);
    PyObject *tail = SLOT(plan, vec ? pl_off[PL_VTAIL] : pl_off[PL_TAIL]);
    if (kern == NULL || Py_TYPE(kern) != kernel_t || grid == NULL || !PyTuple_CheckExact(grid) ||
        PyTuple_GET_SIZE(grid) != 3 || tail == NULL || !PyTuple_CheckExact(tail) || PyTuple_GET_SIZE(tail) > 8)
        return 0;  /* (a kernel not compiled yet: the Python path compiles it) */
    for (int k = 0; k < KN_N; k++)
        if (SLOT(kern, kn_off[k]) == NULL)
            return 0;
    if (PyObject_IsTrue(SLOT(kern, kn_off[KN_DIMS])) != 0) {
        PyErr_Clear();
        return 0;  /* (Dims parameters: Kernel.launch flattens them) */
    }
    /* the arguments: out, a, then b's pointer or the scalar through its converter (plan.steps[1][1]),
       then the tail, packed by the kernel's struct into its block (Kernel.launch) */
    PyObject *third;
    if (b != NULL) {
        third = Py_NewRef(SLOT(b, a_off[A_PTR]));
    } else {
        PyObject *steps = SLOT(plan, pl_off[PL_STEPS]), *st, *conv;
        if (steps == NULL || !PyTuple_CheckExact(steps) || PyTuple_GET_SIZE(steps) != 2 ||
            !PyTuple_CheckExact(st = PyTuple_GET_ITEM(steps, 1)) || PyTuple_GET_SIZE(st) != 2 ||
            (conv = PyTuple_GET_ITEM(st, 1)) == Py_None)
            return 0;
        if (conv == to_f32 && PyFloat_CheckExact(value) && fabs(PyFloat_AS_DOUBLE(value)) < 3.4e38)
            third = Py_NewRef(value);  /* (elementwise._to_f32 of a float in range: the float itself) */
        else
            third = PyObject_CallOneArg(conv, value);
        if (third == NULL) {
            PyErr_Clear();  /* (the Python path converts it again, and raises what it raises) */
            return 0;
        }
    }
    Py_ssize_t nt = PyTuple_GET_SIZE(tail);
    PyObject *pa[2 + 3 + 8] = {SLOT(kern, kn_off[KN_BLOCK]), zero, SLOT(out, a_off[A_PTR]), SLOT(a, a_off[A_PTR]), third};
    for (Py_ssize_t j = 0; j < nt; j++)
        pa[5 + j] = PyTuple_GET_ITEM(tail, j);
    if (!pack_direct(kern, pa + 2, 3 + nt)) {
        PyObject *packed = PyObject_Vectorcall(SLOT(kern, kn_off[KN_PACK]), pa, 5 + nt, NULL);
        if (packed == NULL) {
            Py_DECREF(third);
            PyErr_Clear();
            return 0;
        }
        Py_DECREF(packed);
    }
    Py_DECREF(third);
    /* Kernel.launch's driver call: _launch(_f, gx, gy, gz, 256, 1, 1, 0, stream, _argv_addr); nothing was
       done until here, so any failure above left it to the Python path */
    PyObject *la[10] = {SLOT(kern, kn_off[KN_F]), PyTuple_GET_ITEM(grid, 0), PyTuple_GET_ITEM(grid, 1),
                        PyTuple_GET_ITEM(grid, 2), block_x, one, one, zero, handle, SLOT(kern, kn_off[KN_ARGV])};
    PyObject *err = PyObject_Vectorcall(SLOT(kern, kn_off[KN_LAUNCH]), la, 10, NULL);
    if (err == NULL)
        return -1;
    int bad = PyObject_IsTrue(err);
    if (bad) {  /* (a CUresult other than 0: raised as Kernel.launch raises it) */
        PyObject *r = bad < 0 ? NULL : PyObject_CallFunctionObjArgs(failed, kern, err, NULL);
        Py_XDECREF(r);
        Py_DECREF(err);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "celementwise: a failed launch did not raise");
        return -1;
    }
    Py_DECREF(err);
    return 1;
}

/* The launch: 1 done, 0 declined (nothing done, no error set: elementwise.elementwise runs it), -1 raised */
static int fast(PyObject *lane, PyObject *prim, PyObject *ins, PyObject *outs) {
    if (!PyList_CheckExact(ins) || !PyList_CheckExact(outs) || PyList_GET_SIZE(outs) < 1 || PyList_GET_SIZE(ins) < 1)
        return 0;
    PyObject *pd = plain_dict(prim, &prim_plain), *ld = plain_dict(lane, &lane_plain);
    if (pd == NULL || ld == NULL)
        return 0;
    PyObject *fn = DGET(pd, s_fn), *ops = DGET(pd, s_operands), *ctx = DGET(ld, s_ctx), *handle = DGET(ld, s_handle);
    if (fn == NULL || ops == NULL || ctx == NULL || handle == NULL || !PyUnicode_CheckExact(fn) ||
        !PyTuple_CheckExact(ops) || PyTuple_GET_SIZE(ops) != 2) {
        PyErr_Clear();
        return 0;
    }
    if (fn == s_power || PyUnicode_Compare(fn, s_power) == 0)
        return 0;
    PyObject *o0 = PyTuple_GET_ITEM(ops, 0), *o = PyTuple_GET_ITEM(ops, 1);
    if (!PyLong_CheckExact(o0) || PyLong_AsLong(o0) != 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *out = PyList_GET_ITEM(outs, 0), *a = PyList_GET_ITEM(ins, 0), *b = NULL, *value = NULL, *key = NULL;
    if (!is_array(out) || !is_array(a))
        return 0;
    PyObject *size = SLOT(out, a_off[A_SIZE]);
    if (!PyLong_CheckExact(size) || PyObject_Not(size))
        return 0;  /* (an empty output: elementwise.run returns at once) */
    PyObject *tb;  /* the second operand's dtype, or the scalar's type */
    if (PyLong_CheckExact(o)) {  /* an array and an array: (fn, (dt, dt), (shape, shape), shape, dtype, ctx) */
        Py_ssize_t k = PyLong_AsSsize_t(o);
        if (k < 0 || k >= PyList_GET_SIZE(ins) || !is_array(b = PyList_GET_ITEM(ins, k))) {
            PyErr_Clear();
            return 0;
        }
        tb = SLOT(b, a_off[A_DTYPE]);
    } else if (Py_TYPE(o) == scalar_t && (value = SLOT(o, value_off)) != NULL && py_type(value) != NULL) {
        /* an array and a scalar: (fn, (dt, type), (shape,), shape, dtype, ctx); comparisons left to Python */
        int cmp = PySet_Contains(compare, fn);
        if (cmp != 0) {
            PyErr_Clear();
            return 0;
        }
        tb = py_type(value);
    } else {
        return 0;
    }
    PyObject *ta = SLOT(a, a_off[A_DTYPE]), *sa = SLOT(a, a_off[A_SHAPE]), *sb = b == NULL ? NULL : SLOT(b, a_off[A_SHAPE]);
    PyObject *so = SLOT(out, a_off[A_SHAPE]), *dto = SLOT(out, a_off[A_DTYPE]);
    if (ta == NULL || tb == NULL || sa == NULL || so == NULL || dto == NULL || (b != NULL && sb == NULL))
        return 0;
    Memo *m = &memo[((uintptr_t)fn >> 4 ^ (uintptr_t)ta >> 4 ^ (uintptr_t)tb >> 6 ^ (uintptr_t)ctx >> 8) & memo_mask];
    PyObject *plan = NULL;
    if (m->plan != NULL && m->fn == fn && m->ta == ta && m->tb == tb && m->dto == dto && m->ctx == ctx &&
        same_shape(m->sa, sa) && same_shape(m->so, so) && (sb == NULL ? m->sb == NULL : same_shape(m->sb, sb))) {
        plan = Py_NewRef(m->plan);  /* (the plan of an equal key: the memo holds every part of it, so none was reused) */
    } else {
        PyObject *pat = PyTuple_Pack(2, ta, tb);
        PyObject *shp = sb != NULL ? PyTuple_Pack(2, sa, sb) : PyTuple_Pack(1, sa);
        if (pat != NULL && shp != NULL)
            key = PyTuple_Pack(6, fn, pat, shp, so, dto, ctx);
        Py_XDECREF(pat);
        Py_XDECREF(shp);
        if (key == NULL) {
            PyErr_Clear();
            return 0;
        }
        plan = PyDict_GetItemWithError(plans, key); /* borrowed */
        Py_DECREF(key);
        if (plan == NULL || Py_TYPE(plan) != plan_t) {
            PyErr_Clear();
            return 0;  /* (no plan yet: the Python path makes it) */
        }
        Py_INCREF(plan);  /* (ours before memo_set lets the slot's old parts go: a finalizer may run there) */
        memo_set(m, (PyObject *[]){fn, ta, tb, sa, sb, so, dto, ctx, plan});
    }
    /* (the plan is ours from here: a scalar's converter runs Python) */
    int r = with_plan(plan, ins, out, a, b, value, handle);
    Py_DECREF(plan);
    return r;
}

static PyObject *memo_slots(PyObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > MEMO_N || (n & (n - 1))) {
        PyErr_Format(PyExc_ValueError, "celementwise.memo_slots: a power of two from 1 to %d, not %ld", MEMO_N, n);
        return NULL;
    }
    memo_clear();
    memo_mask = (uintptr_t)n - 1;
    Py_RETURN_NONE;
}

static PyObject *ew(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (entry_checks(plans != NULL, "celementwise", n, 4, "ew(lane, prim, ins, outs)"))
        return NULL;
    int r = fast(a[0], a[1], a[2], a[3]);
    if (r > 0)
        Py_RETURN_NONE;
    if (r < 0)
        return NULL;
    return PyObject_Vectorcall(python_ew, a, 4, NULL);
}

static PyMethodDef methods[] = {
    {"memo_slots", memo_slots, METH_O, "memo_slots(n): the plan memo's slots (a power of two up to 16; emptied)"},
    {"init", init, METH_VARARGS,
     "init(plans, elementwise, failed, comparisons, Scalar, DeviceArray, KernelPair, _Plan, Kernel, _to_f32)"},
    {"ew", (PyCFunction)(void (*)(void))ew, METH_FASTCALL, "ew(lane, prim, ins, outs): the elementwise kernel"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_laneflow_celementwise", NULL, -1, methods};

PyMODINIT_FUNC PyInit__laneflow_celementwise(void) { return PyModule_Create(&module); }
