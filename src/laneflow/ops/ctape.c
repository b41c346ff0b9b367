/* The tape's node maker (ops/ctape.py loads it; ops/tape_steps.py calls it from the compiled steps).

   A replayed op call makes its recorded nodes anew on the call's arrays: an ArrayData with its ten
   fields, its inputs' user counts raised by one, appended to the replay's list of made nodes, and
   usually an Array bound to it. Written out in Python that is about fifteen attribute stores a call;
   here it is one call. The objects are made as object.__new__ makes them (the type's tp_alloc) and
   their __slots__ are filled through the slots' offsets, read once from the types' member
   descriptors (init), so the objects are exactly those the Python path makes.

   node(made, spec, prim, *inputs) -> the node     spec: (shape, dtype, stream, device, arrays)
   array(made, spec, prim, *inputs) -> an Array bound to the node (the node's arrays count is spec's)
   fresh(prim, inputs, shape, dtype, stream) -> an Array bound to a new node held by it (every op's node:
       ops/core.py)
   same_counts(made, users, held) -> whether the made nodes' counts are the recorded ones
   step(replayer, next, spec) -> a replayed call's step (below: the compiled step of tape_steps.py, as data) */

#include "../native.h"
#include <string.h>

static PyTypeObject *node_type, *array_type;
/* offsets of ArrayData's slots, in NODE_SLOTS' order, and of Array's _data */
static const char *NODE_SLOTS[] = {"shape", "dtype", "stream", "device", "prim", "inputs", "siblings",
                                   "buffer", "users", "arrays"};
enum { SHAPE, DTYPE, STREAM, DEVICE, PRIM, INPUTS, SIBLINGS, BUFFER, USERS, ARRAYS, NSLOTS };
static Py_ssize_t node_off[NSLOTS], data_off;
static PyObject *zero, *one;

static PyObject *init(PyObject *self, PyObject *args) {
    PyTypeObject *nt, *at;
    Py_ssize_t offs[NSLOTS], d_off;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &nt, &PyType_Type, &at))
        return NULL;
    for (int k = 0; k < NSLOTS; k++)  /* (all read before any is kept: a failed init changes nothing) */
        if (offset_of(nt, NODE_SLOTS[k], &offs[k]) < 0)
            return NULL;
    if (offset_of(at, "_data", &d_off) < 0)
        return NULL;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    memcpy(node_off, offs, sizeof offs);
    data_off = d_off;
    Py_XSETREF(node_type, (PyTypeObject *)Py_NewRef(nt));
    Py_XSETREF(array_type, (PyTypeObject *)Py_NewRef(at));
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* A new node (a new reference): its fields, and its inputs' user counts raised by one. ``inputs``: the
   inputs as a tuple (NULL: made here from in[0..n_in)). The inputs must have been checked (checked_inputs). */
static PyObject *new_node(PyObject *shape, PyObject *dtype, PyObject *stream, PyObject *device, PyObject *prim,
                          PyObject *arrays, PyObject *inputs, PyObject *const *in, Py_ssize_t n_in) {
    if (inputs == NULL) {
        inputs = PyTuple_New(n_in);
        if (inputs == NULL)
            return NULL;
        for (Py_ssize_t k = 0; k < n_in; k++)  /* (filled before anything else is allocated) */
            PyTuple_SET_ITEM(inputs, k, Py_NewRef(in[k]));
    } else {
        Py_INCREF(inputs);
    }
    PyObject *n = node_type->tp_alloc(node_type, 0);
    if (n == NULL) {
        Py_DECREF(inputs);
        return NULL;
    }
    SLOT(n, node_off[SHAPE]) = Py_NewRef(shape);
    SLOT(n, node_off[DTYPE]) = Py_NewRef(dtype);
    SLOT(n, node_off[STREAM]) = Py_NewRef(stream);
    SLOT(n, node_off[DEVICE]) = Py_NewRef(device);
    SLOT(n, node_off[PRIM]) = Py_NewRef(prim);
    SLOT(n, node_off[INPUTS]) = inputs;
    SLOT(n, node_off[SIBLINGS]) = Py_NewRef(Py_None);
    SLOT(n, node_off[BUFFER]) = Py_NewRef(Py_None);
    SLOT(n, node_off[USERS]) = Py_NewRef(zero);
    SLOT(n, node_off[ARRAYS]) = Py_NewRef(arrays);
    for (Py_ssize_t k = 0; k < n_in; k++) {
        PyObject **u = &SLOT(in[k], node_off[USERS]);
        Py_ssize_t v = PyLong_AsSsize_t(*u);
        PyObject *w;
        if (v == -1 && PyErr_Occurred()) {  /* (a count past Py_ssize_t: Python's int addition) */
            PyErr_Clear();
            w = PyNumber_Add(*u, one);
        } else {
            w = v == PY_SSIZE_T_MAX ? PyNumber_Add(*u, one) : PyLong_FromSsize_t(v + 1);
        }
        if (w == NULL) {  /* (out of memory: the earlier inputs' counts stay raised, as a Python step's would) */
            Py_DECREF(n);
            return NULL;
        }
        Py_SETREF(*u, w);
    }
    return n;
}

/* 0 when every one of in[0..n_in) is a node with an int user count, else -1 with a TypeError */
static int checked_inputs(PyObject *const *in, Py_ssize_t n_in, const char *who) {
    for (Py_ssize_t k = 0; k < n_in; k++) {  /* all checked before anything changes */
        if (!PyObject_TypeCheck(in[k], node_type) || SLOT(in[k], node_off[USERS]) == NULL ||
            !PyLong_CheckExact(SLOT(in[k], node_off[USERS]))) {
            PyErr_Format(PyExc_TypeError, "%s: an input is not a node with a user count", who);
            return -1;
        }
    }
    return 0;
}

/* The node of (made, spec, prim, *inputs); a new reference, appended to made. */
static PyObject *make(PyObject *const *args, Py_ssize_t nargs) {
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ctape: init was not called");
        return NULL;
    }
    if (nargs < 3 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]) || PyTuple_GET_SIZE(args[1]) != 5) {
        PyErr_SetString(PyExc_TypeError, "ctape: (made list, (shape, dtype, stream, device, arrays), prim, *inputs)");
        return NULL;
    }
    if (checked_inputs(args + 3, nargs - 3, "ctape") < 0)
        return NULL;
    PyObject *spec = args[1];
    PyObject *n = new_node(PyTuple_GET_ITEM(spec, 0), PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 2),
                           PyTuple_GET_ITEM(spec, 3), args[2], PyTuple_GET_ITEM(spec, 4), NULL, args + 3, nargs - 3);
    if (n == NULL)
        return NULL;
    if (PyList_Append(args[0], n) < 0) {
        Py_DECREF(n);
        return NULL;
    }
    return n;
}

static PyObject *s_device;

/* fresh(prim, inputs, shape, dtype, stream) -> an Array bound to a new node of prim over the tuple inputs,
   on stream (its device read from it), held by that one array: ops/core.py's node in one call. */
static PyObject *fresh(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ctape: init was not called");
        return NULL;
    }
    if (nargs != 5 || !PyTuple_CheckExact(args[1]) || !PyTuple_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "ctape.fresh: (prim, inputs tuple, shape tuple, dtype, stream)");
        return NULL;
    }
    PyObject *inputs = args[1];
    PyObject *const *in = &PyTuple_GET_ITEM(inputs, 0);
    Py_ssize_t n_in = PyTuple_GET_SIZE(inputs);
    if (checked_inputs(in, n_in, "ctape.fresh") < 0)
        return NULL;
    if (s_device == NULL && (s_device = PyUnicode_InternFromString("device")) == NULL)
        return NULL;
    PyObject *device = PyObject_GetAttr(args[4], s_device);
    if (device == NULL)
        return NULL;
    PyObject *n = new_node(args[2], args[3], args[4], device, args[0], one, inputs, in, n_in);
    Py_DECREF(device);
    if (n == NULL)
        return NULL;
    PyObject *a = array_type->tp_alloc(array_type, 0);
    if (a == NULL) {  /* (out of memory: the inputs' counts stay raised, as in array) */
        Py_DECREF(n);
        return NULL;
    }
    SLOT(a, data_off) = n;  /* (the reference new_node returned) */
    return a;
}

static PyObject *node(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return make(args, nargs);
}

static PyObject *array(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *n = make(args, nargs);
    if (n == NULL)
        return NULL;
    PyObject *a = array_type->tp_alloc(array_type, 0);
    if (a == NULL) {
        Py_DECREF(n);
        return NULL;
    }
    SLOT(a, data_off) = n;  /* (the reference make returned) */
    return a;
}

/* -- the common binary op call (ops/elementwise.py's _binary) in one C call ------------------------------

   binary(state, a, b) -> the result Array, or None: declined, nothing done (the Python op runs; it also
   learns what this reads: a signature's dtype, a scalar's primitive). state: (both, with_scalar, seen_aa,
   seen_as, seen_sa, floats): the op's primitive of two arrays, its cache of scalar primitives by (type,
   value, position), its three caches of result dtypes (array op array by dtypes, array op scalar by (dtype,
   type), scalar op array by (type, dtype)), the float dtypes. Taken: an array with an array of its shape, or
   with a Python float (an int too, over a float dtype), either order, on the current stream's device, a
   signature and a scalar seen before, the stream found as defaults.current_stream finds it without a lookup
   (a `with lf.stream` block's, or the remembered default), no tracing and no plan-cache watch (those make
   the Python op take it). */
static PyObject *b_local, *b_defaults, *b_tracing, *b_watch;
static PyObject *s_stack, *s_last_default, *s_default_device, *s_closed;

static PyObject *init_binary(PyObject *self, PyObject *args) {
    PyObject *local, *defaults, *tracing, *watch;
    if (!PyArg_ParseTuple(args, "OO!O!O!", &local, &PyDict_Type, &defaults, &PyList_Type, &tracing, &PyList_Type,
                          &watch))
        return NULL;
#define INTERN(v, s) if (v == NULL && (v = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(s_stack, "stack"); INTERN(s_last_default, "_last_default"); INTERN(s_default_device, "_default_device");
    INTERN(s_closed, "_closed"); INTERN(s_device, "device");
#undef INTERN
    Py_XSETREF(b_local, Py_NewRef(local));
    Py_XSETREF(b_defaults, Py_NewRef(defaults));
    Py_XSETREF(b_tracing, Py_NewRef(tracing));
    Py_XSETREF(b_watch, Py_NewRef(watch));
    Py_RETURN_NONE;
}

/* An AttributeError (what a missing attribute raises) is a decline: cleared, 0. Any other error (from
   Python code run on the way: a device's __eq__, a property, a signal handler) is passed on: -1. */
static int declined(void) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* defaults.current_stream() where it needs no lookup: a new reference; NULL with no error set (the Python
   op looks it up) or with an error set (passed on) */
static PyObject *current_stream_fast(void) {
    PyObject *stack = PyObject_GetAttr(b_local, s_stack);
    if (stack == NULL) {
        if (declined() < 0)
            return NULL;
    } else {
        PyObject *st = PyList_CheckExact(stack) && PyList_GET_SIZE(stack) > 0
                           ? Py_NewRef(PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1)) : NULL;
        int empty = PyList_CheckExact(stack) && PyList_GET_SIZE(stack) == 0;
        Py_DECREF(stack);
        if (st != NULL || !empty)
            return st;
    }
    PyObject *last = PyDict_GetItemWithError(b_defaults, s_last_default);  /* borrowed */
    PyObject *dd = last == NULL ? NULL : PyDict_GetItemWithError(b_defaults, s_default_device);
    if (last == NULL || dd == NULL || !PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 2)
        return NULL;  /* (an error from the dict lookups, if any, stays set) */
    PyObject *dev = PyTuple_GET_ITEM(last, 0), *st = Py_NewRef(PyTuple_GET_ITEM(last, 1));
    if (dev == Py_None || dev != dd) {
        Py_DECREF(st);
        return NULL;
    }
    PyObject *closed = PyObject_GetAttr(st, s_closed);
    if (closed == NULL) {
        Py_DECREF(st);
        declined();
        return NULL;
    }
    Py_DECREF(closed);
    if (closed != Py_False) {
        Py_DECREF(st);
        return NULL;
    }
    return st;
}

static int same_device(PyObject *x, PyObject *y) {  /* x is y or x == y: 1, 0, -1 with the error set */
    return x == y ? 1 : PyObject_RichCompareBool(x, y, Py_EQ);
}

/* A memo of the op's small caches (a scalar's primitive, a signature's result dtype) by the identity of
   the dict and the key's parts: a hit makes no key tuple and hashes nothing (numpy dtypes hash slowly).
   It holds a reference to each part, so no identity it compares was reused; those caches only ever gain
   entries, and an entry's value is what the same key gives again. */
#define GM_N 32
typedef struct { PyObject *d, *x, *y, *z, *v; } GetMemo;
static GetMemo gm[GM_N];

/* dict[(x, y)], or dict[(x, y, z)] (z not NULL): a new reference, or NULL (missing, or an error set) */
static PyObject *memo_get(PyObject *dict, PyObject *x, PyObject *y, PyObject *z) {
    GetMemo *m = &gm[((uintptr_t)dict >> 4 ^ (uintptr_t)x >> 4 ^ (uintptr_t)y >> 6 ^ (uintptr_t)z >> 8) & (GM_N - 1)];
    if (m->v != NULL && m->d == dict && m->x == x && m->y == y && m->z == z)
        return Py_NewRef(m->v);
    PyObject *key = z != NULL ? PyTuple_Pack(3, x, y, z) : PyTuple_Pack(2, x, y);
    if (key == NULL)
        return NULL;
    PyObject *v = Py_XNewRef(PyDict_GetItemWithError(dict, key));
    Py_DECREF(key);
    if (v == NULL)
        return NULL;
    PyObject *old[5] = {m->d, m->x, m->y, m->z, m->v};  /* (all set before any old part goes: a finalizer may run) */
    m->d = Py_NewRef(dict);
    m->x = Py_NewRef(x);
    m->y = Py_NewRef(y);
    m->z = Py_XNewRef(z);
    m->v = Py_NewRef(v);
    for (int k = 0; k < 5; k++)
        Py_XDECREF(old[k]);
    return v;
}

/* binary's work, its state checked (a 6-tuple) */
static PyObject *binary_of(PyObject *state, PyObject *a, PyObject *b) {
    if (b_local == NULL || node_type == NULL)
        Py_RETURN_NONE;
    if (PyList_GET_SIZE(b_tracing) < 1 || PyList_GET_SIZE(b_watch) < 1)
        Py_RETURN_NONE;
    int t = PyObject_IsTrue(PyList_GET_ITEM(b_tracing, 0));
    int w = t == 0 ? PyObject_IsTrue(PyList_GET_ITEM(b_watch, 0)) : t;
    if (w != 0)
        return w < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *arr = Py_TYPE(a) == array_type ? a : Py_TYPE(b) == array_type ? b : NULL, *other = arr == a ? b : a;
    if (arr == NULL)
        Py_RETURN_NONE;
    PyObject *oc = (PyObject *)Py_TYPE(other);
    int scalar = oc == (PyObject *)&PyFloat_Type || oc == (PyObject *)&PyLong_Type;
    if (!scalar && (arr != a || oc != (PyObject *)array_type))
        Py_RETURN_NONE;  /* (an array second after something else, a numpy scalar, a list: the Python op) */
    /* references of our own from here: Python code may run below (a device's __eq__, a property, a
       collection's finalizers), and another thread may rebind an operand meanwhile (x += 1 frees its old node) */
    PyObject *d = Py_XNewRef(SLOT(arr, data_off)), *e = scalar ? NULL : Py_XNewRef(SLOT(b, data_off));
    PyObject *prim = NULL, *out = NULL, *st = NULL, *sdev = NULL, *res = NULL;
    PyObject *dshape = NULL, *dtype = NULL, *ddev = NULL;
    if (d == NULL || Py_TYPE(d) != node_type || (!scalar && (e == NULL || Py_TYPE(e) != node_type)))
        goto decline;
    dshape = Py_XNewRef(SLOT(d, node_off[SHAPE]));
    dtype = Py_XNewRef(SLOT(d, node_off[DTYPE]));
    ddev = Py_XNewRef(SLOT(d, node_off[DEVICE]));
    if (dshape == NULL || dtype == NULL || ddev == NULL || SLOT(d, node_off[USERS]) == NULL ||
        !PyLong_CheckExact(SLOT(d, node_off[USERS])))
        goto decline;
    if (scalar) {
        if (oc == (PyObject *)&PyLong_Type) {
            int fl = PySet_Contains(PyTuple_GET_ITEM(state, 5), dtype);
            if (fl <= 0)
                goto decline_or_fail;
        }
        prim = memo_get(PyTuple_GET_ITEM(state, 1), oc, other, arr == a ? one : zero);  /* (type, value, position) */
        if (prim == NULL)
            goto decline_or_fail;
        out = arr == a ? memo_get(PyTuple_GET_ITEM(state, 3), dtype, oc, NULL)
                       : memo_get(PyTuple_GET_ITEM(state, 4), oc, dtype, NULL);
    } else {
        PyObject *edev = SLOT(e, node_off[DEVICE]), *eshape = SLOT(e, node_off[SHAPE]), *edt = SLOT(e, node_off[DTYPE]);
        if (edev == NULL || eshape == NULL || edt == NULL || SLOT(e, node_off[USERS]) == NULL ||
            !PyLong_CheckExact(SLOT(e, node_off[USERS])))
            goto decline;
        Py_INCREF(edev);
        int same = same_device(edev, ddev);
        Py_DECREF(edev);
        if (same <= 0)
            goto decline_or_fail;
        eshape = SLOT(e, node_off[SHAPE]);  /* (read again: Python may have run) */
        if (eshape == NULL)
            goto decline;
        int eq = eshape == dshape ? 1 : PyObject_RichCompareBool(eshape, dshape, Py_EQ);
        if (eq <= 0)
            goto decline_or_fail;  /* (broadcasting: the Python op) */
        prim = Py_NewRef(PyTuple_GET_ITEM(state, 0));
        edt = SLOT(e, node_off[DTYPE]);
        if (edt == NULL)
            goto decline;
        out = memo_get(PyTuple_GET_ITEM(state, 2), dtype, edt, NULL);
    }
    if (out == NULL)
        goto decline_or_fail;
    st = current_stream_fast();
    if (st == NULL)
        goto decline_or_fail;
    sdev = PyObject_GetAttr(st, s_device);
    if (sdev == NULL)
        goto decline_or_fail;
    int same = same_device(ddev, sdev);
    if (same <= 0)
        goto decline_or_fail;
    if (SLOT(d, node_off[USERS]) == NULL || !PyLong_CheckExact(SLOT(d, node_off[USERS])) ||
        (e != NULL && (SLOT(e, node_off[USERS]) == NULL || !PyLong_CheckExact(SLOT(e, node_off[USERS])))))
        goto decline;  /* (checked again: Python may have run since) */
    PyObject *in[2] = {d, e};
    PyObject *n = new_node(dshape, out, st, sdev, prim, one, NULL, in, e == NULL ? 1 : 2);
    if (n == NULL)
        goto done;
    res = array_type->tp_alloc(array_type, 0);
    if (res == NULL) {
        Py_DECREF(n);
        goto done;
    }
    SLOT(res, data_off) = n;
    goto done;
decline_or_fail:
    if (PyErr_Occurred())
        goto done;  /* (an error raised on the way: passed on) */
decline:
    res = Py_NewRef(Py_None);
done:
    Py_XDECREF(d);
    Py_XDECREF(e);
    Py_XDECREF(dshape);
    Py_XDECREF(dtype);
    Py_XDECREF(ddev);
    Py_XDECREF(prim);
    Py_XDECREF(out);
    Py_XDECREF(st);
    Py_XDECREF(sdev);
    return res;
}

static PyObject *binary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 6) {
        PyErr_SetString(PyExc_TypeError, "ctape.binary(state, a, b)");
        return NULL;
    }
    return binary_of(args[0], args[1], args[2]);
}

/* same_counts(made, users, held): whether every node of the list made has the user count of the list
   users and is held by an array exactly where the bytes held are 1 (the recorded graph's counts: what a
   whole replay's evaluation checks before it takes the tape's graph, ops/tape_replay.py). */
static PyObject *same_counts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ctape: init was not called");
        return NULL;
    }
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyBytes_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "ctape.same_counts(made list, users list, held bytes)");
        return NULL;
    }
    PyObject *made = args[0], *users = args[1];
    const char *held = PyBytes_AS_STRING(args[2]);
    Py_ssize_t n = PyList_GET_SIZE(made);
    if (PyList_GET_SIZE(users) != n || PyBytes_GET_SIZE(args[2]) != n)
        Py_RETURN_FALSE;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *d = PyList_GET_ITEM(made, k);
        if (!PyObject_TypeCheck(d, node_type))
            Py_RETURN_FALSE;
        PyObject *u = SLOT(d, node_off[USERS]), *a = SLOT(d, node_off[ARRAYS]);
        if (u == NULL || a == NULL)
            Py_RETURN_FALSE;
        int eq = PyObject_RichCompareBool(u, PyList_GET_ITEM(users, k), Py_EQ);
        if (eq <= 0) {
            if (eq < 0)
                return NULL;
            Py_RETURN_FALSE;
        }
        int t = PyObject_IsTrue(a);
        if (t < 0)
            return NULL;
        if (t != (held[k] != 0))
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}


/* ---- the steps ------------------------------------------------------------------------------------

   A step answers one op call of a replay (ops/tape_steps.py: Plan says what each field means; _python
   writes the same step out as Python source, which this interprets, in the same order): the head check
   (op, argument counts, thread, tracer, stream), the arrays and static arguments, then the nodes, the
   result, and the replayer's next step. A check that fails calls R.diverge(fn, args, kw). */

/* Replayer's slots and Tape's leaves, read by init_steps */
static const char *R_SLOTS[] = {"thread", "st", "stack", "made", "bound", "tape", "call", "done"};
enum { R_THREAD, R_ST, R_STACK, R_MADE, R_BOUND, R_TAPE, R_CALL, R_DONE, R_NSLOTS };
static Py_ssize_t r_off[R_NSLOTS], leaves_off;
static PyTypeObject *replayer_type, *tape_type;
/* the steps' globals: the tracer's flag list, the speculative launch's watch list and its first_node,
   multi_output, current_stream, the keyword default MISS, and same */
static PyObject *g_tr, *g_w, *g_first, *g_mo, *g_cs, *g_miss, *g_same;
static PyObject *s_diverge, *s_bind, *s_make, *s_class, *s_data;

enum { IS, EQ, TUPLE, SLICE, SAME_AS };           /* tape_steps.check_of */
enum { DEPTH, CURRENT };                           /* Plan.where */
enum { MADE, HERE, BOUND, FIRST };                 /* Plan.arrays' how */
enum { ARG, MADE_OUT, VALUE };                     /* Plan.outs' kinds */
#define MAXV 32    /* arguments */
#define MAXE 64    /* values: arrays, extras, nodes */
#define MAXR 32    /* results */

typedef struct { int pos, sub, how; Py_ssize_t arg; PyObject *argobj; } ArrSpec;
typedef struct { int pos, sub; PyObject *check; } StatSpec;
typedef struct { PyObject *prim; int host; PyObject *spec; int nin, first; int *ins; } NodeSpec;
typedef struct { int kind, a, incr; } OutSpec;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *R, *next, *spec;
    PyObject *fn, *names, *where_stream, *extra, *groups;   /* (borrowed from spec) */
    int npos, nnames, where_mode, ncont, narr, nstat, nextra, nnode, watch, nout, kind;
    Py_ssize_t depth;
    int (*cont)[3];
    ArrSpec *arr;
    StatSpec *stat;
    NodeSpec *node;
    OutSpec *out;
    int *ins;
} Step;

static PyObject *slot_get(PyObject *o, Py_ssize_t off, const char *name) {  /* borrowed */
    PyObject *v = SLOT(o, off);
    if (v == NULL)
        PyErr_Format(PyExc_AttributeError, "ctape step: %s is not set", name);
    return v;
}

static void slot_set(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = Py_NewRef(v);
    Py_XDECREF(old);
}

static PyObject *item(PyObject *seq, Py_ssize_t k) {  /* seq[k], a new reference (a list's fast) */
    if (PyList_CheckExact(seq)) {
        if (k < 0 || k >= PyList_GET_SIZE(seq)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            return NULL;
        }
        return Py_NewRef(PyList_GET_ITEM(seq, k));
    }
    PyObject *i = PyLong_FromSsize_t(k);
    if (i == NULL)
        return NULL;
    PyObject *r = PyObject_GetItem(seq, i);
    Py_DECREF(i);
    return r;
}

static int truth_of_first(PyObject *lst) {  /* lst[0] is true: 1, 0, -1 on error */
    PyObject *v = item(lst, 0);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* x.__class__ is cls, as the Python step reads it (a proxy may say it is another class): 1, 0, -1 */
static int class_is(PyObject *x, PyObject *cls) {
    if ((PyObject *)Py_TYPE(x) == cls)
        return 1;
    PyObject *c = PyObject_GetAttr(x, s_class);
    if (c == NULL)
        return -1;
    Py_DECREF(c);
    return c == cls;
}

/* an argument, or its element sub (a new reference): containers are read as the Python step reads them,
   x[sub], checked (Python code may have changed a list since its length was checked) */
static PyObject *arg_at(PyObject *const *vals, int pos, int sub) {
    return sub < 0 ? Py_NewRef(vals[pos]) : item(vals[pos], sub);
}

/* Whether x fails check (tape_steps.check_of): 1, 0, or -1 on an error. */
static int differs(PyObject *x, PyObject *check) {
    long how = PyLong_AsLong(PyTuple_GET_ITEM(check, 0));
    switch (how) {
    case IS:
        return x != PyTuple_GET_ITEM(check, 1);
    case EQ: {
        int c = class_is(x, PyTuple_GET_ITEM(check, 1));
        if (c <= 0)
            return c < 0 ? -1 : 1;
        PyObject *r = PyObject_RichCompare(x, PyTuple_GET_ITEM(check, 2), Py_NE);
        if (r == NULL)
            return -1;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        return t;
    }
    case TUPLE: {
        PyObject *subs = PyTuple_GET_ITEM(check, 1);
        Py_ssize_t n = PyTuple_GET_SIZE(subs);
        int c = class_is(x, (PyObject *)&PyTuple_Type);
        if (c <= 0)
            return c < 0 ? -1 : 1;
        Py_ssize_t len = PyObject_Length(x);
        if (len != n)
            return len < 0 ? -1 : 1;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *e = PyTuple_CheckExact(x) ? Py_NewRef(PyTuple_GET_ITEM(x, k)) : item(x, k);
            if (e == NULL)
                return -1;
            int d = differs(e, PyTuple_GET_ITEM(subs, k));
            Py_DECREF(e);
            if (d)
                return d;
        }
        return 0;
    }
    case SLICE: {
        static const char *fields[3] = {"start", "stop", "step"};
        int c = class_is(x, (PyObject *)&PySlice_Type);
        if (c <= 0)
            return c < 0 ? -1 : 1;
        PyObject *subs = PyTuple_GET_ITEM(check, 1);
        for (int k = 0; k < 3; k++) {
            PyObject *part;
            if (Py_IS_TYPE(x, &PySlice_Type)) {  /* (a slice's fields, read directly) */
                PySliceObject *sl = (PySliceObject *)x;
                part = Py_NewRef(k == 0 ? sl->start : k == 1 ? sl->stop : sl->step);
            } else {
                part = PyObject_GetAttrString(x, fields[k]);
            }
            if (part == NULL)
                return -1;
            int d = differs(part, PyTuple_GET_ITEM(subs, k));
            Py_DECREF(part);
            if (d)
                return d;
        }
        return 0;
    }
    default: {  /* SAME_AS: not same(x, v) */
        PyObject *r = PyObject_CallFunctionObjArgs(g_same, x, PyTuple_GET_ITEM(check, 1), NULL);
        if (r == NULL)
            return -1;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        return t < 0 ? -1 : !t;
    }
    }
}

static int valid_check(PyObject *c, int depth) {  /* (the constructor's: differs then reads blindly) */
    if (depth > 8 || !PyTuple_CheckExact(c) || PyTuple_GET_SIZE(c) < 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(c, 0)))
        return 0;
    long how = PyLong_AsLong(PyTuple_GET_ITEM(c, 0));
    Py_ssize_t n = PyTuple_GET_SIZE(c);
    if (how == IS || how == SAME_AS)
        return n == 2;
    if (how == EQ)
        return n == 3 && PyType_Check(PyTuple_GET_ITEM(c, 1));
    if (how == TUPLE || how == SLICE) {
        PyObject *subs = PyTuple_GET_ITEM(c, 1);
        if (n != 2 || !PyTuple_CheckExact(subs) || (how == SLICE && PyTuple_GET_SIZE(subs) != 3))
            return 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(subs); k++)
            if (!valid_check(PyTuple_GET_ITEM(subs, k), depth + 1))
                return 0;
        return 1;
    }
    return 0;
}

static PyObject *step_vcall(PyObject *op, PyObject *const *a, size_t nargsf, PyObject *kwnames);

static int ints(PyObject *t, Py_ssize_t n, long *out) {  /* a tuple of n ints */
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != n)
        return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = PyTuple_GET_ITEM(t, k);
        if (!PyLong_CheckExact(v))
            return -1;
        out[k] = PyLong_AsLong(v);
        if (out[k] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static void step_free_specs(Step *s) {
    PyMem_Free(s->cont); PyMem_Free(s->arr); PyMem_Free(s->stat); PyMem_Free(s->node); PyMem_Free(s->out);
    PyMem_Free(s->ins);
    s->cont = NULL; s->arr = NULL; s->stat = NULL; s->node = NULL; s->out = NULL; s->ins = NULL;
}

static int step_clear(PyObject *op) {
    Step *s = (Step *)op;
    Py_CLEAR(s->R);
    Py_CLEAR(s->next);
    Py_CLEAR(s->spec);  /* (the borrowed fields went with it: a cleared step raises when called) */
    return 0;
}

static int step_traverse(PyObject *op, visitproc visit, void *arg) {
    Step *s = (Step *)op;
    Py_VISIT(s->R);
    Py_VISIT(s->next);
    Py_VISIT(s->spec);
    return 0;
}

static void step_dealloc(PyObject *op) {
    PyObject_GC_UnTrack(op);
    step_clear(op);
    step_free_specs((Step *)op);
    Py_TYPE(op)->tp_free(op);
}

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_laneflow_ctape.Step",
    .tp_basicsize = sizeof(Step),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A replayed op call's step (ops/tape_steps.py's Plan, interpreted)",
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Step, vectorcall),
    .tp_traverse = step_traverse,
    .tp_clear = step_clear,
    .tp_dealloc = step_dealloc,
};

/* whether argument pos is a container the step checks, with an element sub (read only after the check) */
static int in_container(Step *s, long pos, long sub) {
    for (int c = 0; c < s->ncont; c++)
        if (s->cont[c][0] == pos && sub < s->cont[c][2])
            return 1;
    return 0;
}

#define BAD(msg) do { PyErr_SetString(PyExc_ValueError, "ctape.step: " msg); goto bad; } while (0)

/* step(replayer, next, spec): spec = (fn, npos, names, where_mode, where_arg, containers, arrays, static,
   extra, nodes, groups, watch, outs, kind), as tape_steps._cspec packs a Plan. ValueError: a plan this
   cannot run (too many values: the Python step runs it). */
static PyObject *step_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (replayer_type == NULL || node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ctape: init and init_steps were not called");
        return NULL;
    }
    if (nargs != 3 || !PyObject_TypeCheck(args[0], replayer_type) || !PyTuple_CheckExact(args[2]) ||
        PyTuple_GET_SIZE(args[2]) != 14) {
        PyErr_SetString(PyExc_TypeError, "ctape.step(replayer, next step or None, spec of 14)");
        return NULL;
    }
    PyObject *spec = args[2];
    Step *s = PyObject_GC_New(Step, &StepType);
    if (s == NULL)
        return NULL;
    s->vectorcall = step_vcall;
    s->R = Py_NewRef(args[0]);
    s->next = Py_NewRef(args[1]);
    s->spec = Py_NewRef(spec);
    s->cont = NULL; s->arr = NULL; s->stat = NULL; s->node = NULL; s->out = NULL; s->ins = NULL;
    PyObject_GC_Track((PyObject *)s);
#define F(k) PyTuple_GET_ITEM(spec, k)
    long v[5];
    s->fn = F(0);
    if (!PyLong_CheckExact(F(1)) || !PyTuple_CheckExact(F(2)) || !PyLong_CheckExact(F(3)))
        BAD("fn, npos, names, where");
    s->npos = (int)PyLong_AsLong(F(1));
    s->names = F(2);
    s->nnames = (int)PyTuple_GET_SIZE(F(2));
    if (s->npos < 0 || s->npos + s->nnames > MAXV)
        BAD("too many arguments");
    for (int k = 0; k < s->nnames; k++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(F(2), k)))
            BAD("a keyword name is not a str");
    s->where_mode = (int)PyLong_AsLong(F(3));
    if (s->where_mode == DEPTH) {
        s->depth = PyLong_AsSsize_t(F(4));
        if (s->depth < 0)
            BAD("depth");
        s->where_stream = NULL;
    } else {
        s->where_stream = F(4);
    }
    PyObject *t;
    t = F(5);  /* containers */
    if (!PyTuple_CheckExact(t))
        BAD("containers");
    s->ncont = (int)PyTuple_GET_SIZE(t);
    s->cont = PyMem_Calloc(s->ncont + 1, sizeof *s->cont);
    if (s->cont == NULL)
        goto nomem;
    for (int k = 0; k < s->ncont; k++) {
        if (ints(PyTuple_GET_ITEM(t, k), 3, v) < 0 || v[0] < 0 || v[0] >= s->npos + s->nnames)
            BAD("a container");
        s->cont[k][0] = (int)v[0]; s->cont[k][1] = (int)v[1]; s->cont[k][2] = (int)v[2];
    }
    t = F(6);  /* arrays: (pos, sub or -1, how, arg) */
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) > MAXE)
        BAD("arrays");
    s->narr = (int)PyTuple_GET_SIZE(t);
    s->arr = PyMem_Calloc(s->narr + 1, sizeof *s->arr);
    if (s->arr == NULL)
        goto nomem;
    for (int k = 0; k < s->narr; k++) {
        PyObject *e = PyTuple_GET_ITEM(t, k);
        if (ints(e, 4, v) < 0 || v[0] < 0 || v[0] >= s->npos + s->nnames || v[2] < MADE || v[2] > FIRST || v[3] < 0 ||
            (v[2] == HERE && v[3] >= k))
            BAD("an array");
        if (v[1] >= 0 && !in_container(s, v[0], v[1]))
            BAD("an array element outside its container");
        ArrSpec *as = &s->arr[k];
        as->pos = (int)v[0]; as->sub = (int)v[1]; as->how = (int)v[2]; as->arg = v[3];
        as->argobj = PyTuple_GET_ITEM(e, 3);
    }
    t = F(7);  /* static: (pos, sub or -1, check) */
    if (!PyTuple_CheckExact(t))
        BAD("static");
    s->nstat = (int)PyTuple_GET_SIZE(t);
    s->stat = PyMem_Calloc(s->nstat + 1, sizeof *s->stat);
    if (s->stat == NULL)
        goto nomem;
    for (int k = 0; k < s->nstat; k++) {
        PyObject *e = PyTuple_GET_ITEM(t, k);
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(e, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(e, 1)) || !valid_check(PyTuple_GET_ITEM(e, 2), 0))
            BAD("a static argument");
        int pos = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 0)), sub = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 1));
        if (pos < 0 || pos >= s->npos + s->nnames)
            BAD("a static argument's position");
        if (sub >= 0 && !in_container(s, pos, sub))
            BAD("a static element outside its container");
        s->stat[k].pos = pos; s->stat[k].sub = sub; s->stat[k].check = PyTuple_GET_ITEM(e, 2);
    }
    t = F(8);  /* extra: (is_made, value) */
    if (!PyTuple_CheckExact(t))
        BAD("extra");
    s->extra = t;
    s->nextra = (int)PyTuple_GET_SIZE(t);
    for (int k = 0; k < s->nextra; k++) {
        PyObject *e = PyTuple_GET_ITEM(t, k);
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 2 || !PyBool_Check(PyTuple_GET_ITEM(e, 0)) ||
            (PyTuple_GET_ITEM(e, 0) == Py_True && !PyLong_CheckExact(PyTuple_GET_ITEM(e, 1))))
            BAD("an extra");
    }
    t = F(9);  /* nodes: (prim, is_host, spec, inputs, first or -1) */
    if (!PyTuple_CheckExact(t))
        BAD("nodes");
    s->nnode = (int)PyTuple_GET_SIZE(t);
    if (s->narr + s->nextra + s->nnode > MAXE)
        BAD("too many values");
    s->node = PyMem_Calloc(s->nnode + 1, sizeof *s->node);
    if (s->node == NULL)
        goto nomem;
    Py_ssize_t total_in = 0;
    for (int k = 0; k < s->nnode; k++) {
        PyObject *e = PyTuple_GET_ITEM(t, k);
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 5 || !PyTuple_CheckExact(PyTuple_GET_ITEM(e, 3)))
            BAD("a node");
        total_in += PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 3));
    }
    s->ins = PyMem_Calloc(total_in + 1, sizeof(int));
    if (s->ins == NULL)
        goto nomem;
    int *in_at = s->ins;
    int base = s->narr + s->nextra;
    for (int k = 0; k < s->nnode; k++) {
        PyObject *e = PyTuple_GET_ITEM(t, k);
        NodeSpec *ns = &s->node[k];
        PyObject *sp = PyTuple_GET_ITEM(e, 2), *ins = PyTuple_GET_ITEM(e, 3);
        if (!PyBool_Check(PyTuple_GET_ITEM(e, 1)) || !PyTuple_CheckExact(sp) || PyTuple_GET_SIZE(sp) != 5 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(e, 4)))
            BAD("a node's fields");
        ns->prim = PyTuple_GET_ITEM(e, 0);
        ns->host = PyTuple_GET_ITEM(e, 1) == Py_True;
        ns->spec = sp;
        ns->first = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 4));
        if (PyTuple_GET_SIZE(ins) > MAXE)
            BAD("a node's inputs");
        ns->nin = (int)PyTuple_GET_SIZE(ins);
        ns->ins = in_at;
        for (int i = 0; i < ns->nin; i++) {
            PyObject *x = PyTuple_GET_ITEM(ins, i);
            long kk = PyLong_CheckExact(x) ? PyLong_AsLong(x) : -1;
            if (kk < 0 || kk >= base + k)  /* (a value made before this node) */
                BAD("a node's input");
            *in_at++ = (int)kk;
        }
    }
    t = F(10);  /* groups: tuples of value indices */
    if (!PyTuple_CheckExact(t))
        BAD("groups");
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++) {
        PyObject *g = PyTuple_GET_ITEM(t, k);
        if (!PyTuple_CheckExact(g))
            BAD("a group");
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(g); i++) {
            PyObject *x = PyTuple_GET_ITEM(g, i);
            long kk = PyLong_CheckExact(x) ? PyLong_AsLong(x) : -1;
            if (kk < 0 || kk >= base + s->nnode)
                BAD("a group's value");
        }
    }
    s->groups = t;
    s->watch = PyObject_IsTrue(F(11));
    if (s->watch < 0)
        goto bad;
    if (s->watch && s->nnode == 0)
        BAD("a watched step without a node");
    t = F(12);  /* outs: (kind, a, b) */
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) > MAXR || PyTuple_GET_SIZE(t) == 0)
        BAD("outs");
    s->nout = (int)PyTuple_GET_SIZE(t);
    s->out = PyMem_Calloc(s->nout + 1, sizeof *s->out);
    if (s->out == NULL)
        goto nomem;
    for (int k = 0; k < s->nout; k++) {
        if (ints(PyTuple_GET_ITEM(t, k), 3, v) < 0)
            BAD("an out");
        OutSpec *o = &s->out[k];
        o->kind = (int)v[0]; o->a = (int)v[1]; o->incr = (int)v[2];
        if ((o->kind == ARG && (o->a < 0 || o->a >= s->npos + s->nnames)) ||
            (o->kind == VALUE && (o->a < 0 || o->a >= base + s->nnode)) || o->kind < ARG || o->kind > VALUE)
            BAD("an out's value");
        if (o->kind == MADE_OUT && (o->a < 0 || o->a >= s->nnode || s->node[o->a].first != k))
            BAD("a result made with no node");  /* (a: the node it is made with) */
    }
    for (int j = 0; j < s->nnode; j++) {
        int f = s->node[j].first;
        if (f >= s->nout || (f >= 0 && s->out[f].kind != MADE_OUT))
            BAD("a node's first result");
    }
    if (!PyLong_CheckExact(F(13)))
        BAD("kind");
    s->kind = (int)PyLong_AsLong(F(13));
    if (s->kind < 0 || s->kind > 2 || (s->kind == 0 && s->nout != 1))
        BAD("kind");
#undef F
    return (PyObject *)s;
nomem:
    PyErr_NoMemory();
bad:
    Py_DECREF(s);
    return NULL;
}

/* the replay's stream check (Plan.where): 1 the call is on it, 0 not, -1 an error */
static int on_stream(Step *s, PyObject *R) {
    PyObject *stack = slot_get(R, r_off[R_STACK], "stack"), *st;
    if (stack == NULL)
        return -1;
    if (s->where_mode == DEPTH && s->depth > 0) {  /* len(R.stack) != depth or R.stack[-1] is not R.st */
        Py_ssize_t n = PyObject_Length(stack);
        if (n < 0)
            return -1;
        if (n != s->depth)
            return 0;
        PyObject *top = item(stack, n - 1);
        if (top == NULL)
            return -1;
        Py_DECREF(top);
        if ((st = slot_get(R, r_off[R_ST], "st")) == NULL)
            return -1;
        return top == st;
    }
    if (s->where_mode == DEPTH) {  /* R.stack or CS() is not R.st */
        int t = PyObject_IsTrue(stack);
        if (t != 0)
            return t < 0 ? -1 : 0;
    }
    PyObject *cur = PyObject_CallNoArgs(g_cs);  /* (Python: it may run anything; R.st is read after it) */
    if (cur == NULL)
        return -1;
    Py_DECREF(cur);  /* (only its identity is compared) */
    if (s->where_mode == DEPTH) {
        if ((st = slot_get(R, r_off[R_ST], "st")) == NULL)
            return -1;
        return cur == st;
    }
    return cur == s->where_stream;
}

static PyObject *step_vcall(PyObject *op, PyObject *const *a, size_t nargsf, PyObject *kwnames) {
    Step *s = (Step *)op;
    if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a tape step takes (fn, args, kw)");
        return NULL;
    }
    if (s->spec == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ctape: a cleared step was called");
        return NULL;
    }
    PyObject *fn = a[0], *args = a[1], *kw = a[2], *R = s->R;
    PyObject *vals[MAXV], *env[MAXE], *res[MAXR];
    PyObject *M = NULL, *result = NULL;
    int nenv = 0, nres = s->nout, t;
    for (int m = 0; m < nres; m++)
        res[m] = NULL;
    Py_INCREF(R);
    /* fn is not k0 or len(args) != npos or kw... or gi() != R.thread or TR[0] or <stream> */
    if (fn != s->fn || !PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != s->npos || !PyDict_CheckExact(kw) ||
        PyDict_GET_SIZE(kw) != s->nnames)
        goto diverge;
    {
        PyObject *th = slot_get(R, r_off[R_THREAD], "thread");
        if (th == NULL)
            goto fail;
        unsigned long want = PyLong_Check(th) ? PyLong_AsUnsignedLong(th) : (unsigned long)-1;
        if (want == (unsigned long)-1 && PyErr_Occurred())
            PyErr_Clear();  /* (not a thread's id: not this thread) */
        if (want != PyThread_get_thread_ident())
            goto diverge;
    }
    if ((t = truth_of_first(g_tr)) != 0) {
        if (t < 0)
            goto fail;
        goto diverge;
    }
    if ((t = on_stream(s, R)) != 1) {
        if (t < 0)
            goto fail;
        goto diverge;
    }
    for (int k = 0; k < s->npos; k++)
        vals[k] = PyTuple_GET_ITEM(args, k);
    for (int j = 0; j < s->nnames; j++) {  /* kw.get(name, MISS) */
        PyObject *x = PyDict_GetItemWithError(kw, PyTuple_GET_ITEM(s->names, j));
        if (x == NULL) {
            if (PyErr_Occurred())
                goto fail;
            x = g_miss;
        }
        vals[s->npos + j] = x;
    }
    if (s->narr || s->nextra || s->nnode) {
        M = slot_get(R, r_off[R_MADE], "made");
        if (M == NULL)
            goto fail;
        Py_INCREF(M);
    }
    for (int k = 0; k < s->ncont; k++) {  /* v.__class__ is not list (tuple) or len(v) != n */
        PyObject *c = vals[s->cont[k][0]];
        t = class_is(c, s->cont[k][1] ? (PyObject *)&PyList_Type : (PyObject *)&PyTuple_Type);
        if (t <= 0) {
            if (t < 0)
                goto fail;
            goto diverge;
        }
        Py_ssize_t n = PyObject_Length(c);
        if (n < 0)
            goto fail;
        if (n != s->cont[k][2])
            goto diverge;
    }
    for (int j = 0; j < s->narr; j++) {  /* each its class, then its node (x._data) */
        ArrSpec *as = &s->arr[j];
        PyObject *x = arg_at(vals, as->pos, as->sub), *e;
        if (x == NULL)
            goto fail;
        if (Py_TYPE(x) == array_type) {
            e = SLOT(x, data_off);
            if (e == NULL)
                PyErr_SetObject(PyExc_AttributeError, s_data);
            Py_XINCREF(e);
        } else {
            t = class_is(x, (PyObject *)array_type);
            if (t == 0) {
                Py_DECREF(x);
                goto diverge;
            }
            e = t < 0 ? NULL : PyObject_GetAttr(x, s_data);
        }
        Py_DECREF(x);
        if (e == NULL)
            goto fail;
        env[nenv++] = e;
    }
    for (int j = 0; j < s->narr; j++) {  /* the arrays' conditions, in order */
        ArrSpec *as = &s->arr[j];
        PyObject *e = env[j], *want;
        switch (as->how) {
        case MADE:
            if (!PyList_CheckExact(M)) {
                PyErr_SetString(PyExc_TypeError, "ctape step: the replay's made list is gone");
                goto fail;
            }
            if ((want = item(M, as->arg)) == NULL)
                goto fail;
            Py_DECREF(want);
            if (e != want)
                goto diverge;
            break;
        case HERE:
            if (e != env[as->arg])
                goto diverge;
            break;
        case BOUND: {
            PyObject *bound = slot_get(R, r_off[R_BOUND], "bound");
            if (bound == NULL || (want = item(bound, as->arg)) == NULL)
                goto fail;
            Py_DECREF(want);
            if (e != want)
                goto diverge;
            break;
        }
        default: {  /* FIRST: e is R.tape.leaves[k] or R.bind(k, e) */
            PyObject *tape = slot_get(R, r_off[R_TAPE], "tape");
            PyObject *leaves = tape == NULL ? NULL : slot_get(tape, leaves_off, "leaves");
            if (leaves == NULL || (want = item(leaves, as->arg)) == NULL)
                goto fail;
            Py_DECREF(want);
            if (e != want) {
                PyObject *bargs[3] = {R, as->argobj, e};
                PyObject *ok = PyObject_VectorcallMethod(s_bind, bargs, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                if (ok == NULL)
                    goto fail;
                t = PyObject_IsTrue(ok);
                Py_DECREF(ok);
                if (t < 0)
                    goto fail;
                if (!t)
                    goto diverge;
            }
        }
        }
    }
    for (int k = 0; k < s->nstat; k++) {
        StatSpec *ss = &s->stat[k];
        PyObject *x = arg_at(vals, ss->pos, ss->sub);
        if (x == NULL)
            goto fail;
        t = differs(x, ss->check);
        Py_DECREF(x);
        if (t) {
            if (t < 0)
                goto fail;
            goto diverge;
        }
    }
    for (int j = 0; j < s->narr; j++) {  /* R.bound[k] = e of each first use */
        if (s->arr[j].how != FIRST)
            continue;
        PyObject *bound = slot_get(R, r_off[R_BOUND], "bound");
        if (bound == NULL || PyObject_SetItem(bound, s->arr[j].argobj, env[j]) < 0)
            goto fail;
    }
    for (int k = 0; k < s->nextra; k++) {
        PyObject *e = PyTuple_GET_ITEM(s->extra, k), *x;
        if (PyTuple_GET_ITEM(e, 0) == Py_True) {
            if (!PyList_CheckExact(M)) {
                PyErr_SetString(PyExc_TypeError, "ctape step: the replay's made list is gone");
                goto fail;
            }
            if ((x = item(M, PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 1)))) == NULL)
                goto fail;
        } else {
            x = Py_NewRef(PyTuple_GET_ITEM(e, 1));
        }
        env[nenv++] = x;
    }
    for (int j = 0; j < s->nnode; j++) {
        NodeSpec *ns = &s->node[j];
        PyObject *margs[3 + MAXE];
        PyObject *prim = ns->host ? PyObject_CallMethodNoArgs(ns->prim, s_make) : Py_NewRef(ns->prim);
        if (prim == NULL)
            goto fail;
        margs[0] = M; margs[1] = ns->spec; margs[2] = prim;
        for (int i = 0; i < ns->nin; i++)
            margs[3 + i] = env[ns->ins[i]];
        PyObject *n = make(margs, 3 + ns->nin);
        Py_DECREF(prim);
        if (n == NULL)
            goto fail;
        env[nenv++] = n;
        if (ns->first >= 0) {  /* its first result: an Array bound to it, counted in its spec */
            PyObject *arr = array_type->tp_alloc(array_type, 0);
            if (arr == NULL)
                goto fail;
            SLOT(arr, data_off) = Py_NewRef(n);
            res[ns->first] = arr;
        }
    }
    for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(s->groups); g++) {
        PyObject *gi = PyTuple_GET_ITEM(s->groups, g);
        PyObject *lst = PyList_New(PyTuple_GET_SIZE(gi));
        if (lst == NULL)
            goto fail;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(gi); i++)
            PyList_SET_ITEM(lst, i, Py_NewRef(env[PyLong_AsLong(PyTuple_GET_ITEM(gi, i))]));
        PyObject *r = PyObject_CallOneArg(g_mo, lst);
        Py_DECREF(lst);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    if (s->watch) {  /* if W[0]: FIRST(n0) */
        if ((t = truth_of_first(g_w)) < 0)
            goto fail;
        if (t) {
            PyObject *r = PyObject_CallOneArg(g_first, env[s->narr + s->nextra]);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        }
    }
    for (int m = 0; m < s->nout; m++) {
        OutSpec *o = &s->out[m];
        if (o->kind == MADE_OUT)
            continue;
        if (o->kind == ARG) {
            res[m] = Py_NewRef(vals[o->a]);
            continue;
        }
        PyObject *d = env[o->a];
        PyObject *arr = array_type->tp_alloc(array_type, 0);
        if (arr == NULL)
            goto fail;
        SLOT(arr, data_off) = Py_NewRef(d);
        res[m] = arr;
        if (o->incr) {  /* d.arrays += 1 */
            PyObject *old = PyObject_GetAttrString(d, "arrays");
            PyObject *w = old == NULL ? NULL : PyNumber_Add(old, one);
            Py_XDECREF(old);
            if (w == NULL || PyObject_SetAttrString(d, "arrays", w) < 0) {
                Py_XDECREF(w);
                goto fail;
            }
            Py_DECREF(w);
        }
    }
    if (s->next == Py_None) {  /* R.done = True; R.call = R.diverge */
        slot_set(R, r_off[R_DONE], Py_True);
        PyObject *dv = PyObject_GetAttr(R, s_diverge);
        if (dv == NULL)
            goto fail;
        slot_set(R, r_off[R_CALL], dv);
        Py_DECREF(dv);
    } else {
        slot_set(R, r_off[R_CALL], s->next);
    }
    if (s->kind == 0) {
        result = res[0];
        res[0] = NULL;
    } else {
        result = s->kind == 1 ? PyTuple_New(s->nout) : PyList_New(s->nout);
        if (result == NULL)
            goto fail;
        for (int m = 0; m < s->nout; m++) {
            if (s->kind == 1)
                PyTuple_SET_ITEM(result, m, res[m]);
            else
                PyList_SET_ITEM(result, m, res[m]);
            res[m] = NULL;
        }
    }
    goto done;
diverge: {
        PyObject *dargs[4] = {R, fn, args, kw};
        result = PyObject_VectorcallMethod(s_diverge, dargs, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        goto done;
    }
fail:
    result = NULL;
done:
    for (int k = 0; k < nenv; k++)
        Py_DECREF(env[k]);
    for (int m = 0; m < nres; m++)
        Py_XDECREF(res[m]);
    Py_XDECREF(M);
    Py_DECREF(R);
    return result;
}

/* init_steps(Replayer, Tape, tracer_flag, watch, first_node, multi_output, current_stream, miss, same) */
static PyObject *init_steps(PyObject *self, PyObject *args) {
    PyTypeObject *rt, *tt;
    PyObject *tr, *w, *first, *mo, *cs, *miss, *same;
    Py_ssize_t offs[R_NSLOTS], l_off;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOOO", &PyType_Type, &rt, &PyType_Type, &tt, &PyList_Type, &tr,
                          &PyList_Type, &w, &first, &mo, &cs, &miss, &same))
        return NULL;
    for (int k = 0; k < R_NSLOTS; k++)
        if (offset_of(rt, R_SLOTS[k], &offs[k]) < 0)
            return NULL;
    if (offset_of(tt, "leaves", &l_off) < 0)
        return NULL;
    if (s_diverge == NULL) {
        if ((s_diverge = PyUnicode_InternFromString("diverge")) == NULL ||
            (s_bind = PyUnicode_InternFromString("bind")) == NULL ||
            (s_make = PyUnicode_InternFromString("make")) == NULL ||
            (s_class = PyUnicode_InternFromString("__class__")) == NULL ||
            (s_data = PyUnicode_InternFromString("_data")) == NULL)
            return NULL;
    }
    if (PyType_Ready(&StepType) < 0)
        return NULL;
    memcpy(r_off, offs, sizeof offs);
    leaves_off = l_off;
    Py_XSETREF(replayer_type, (PyTypeObject *)Py_NewRef(rt));
    Py_XSETREF(tape_type, (PyTypeObject *)Py_NewRef(tt));
    Py_XSETREF(g_tr, Py_NewRef(tr));
    Py_XSETREF(g_w, Py_NewRef(w));
    Py_XSETREF(g_first, Py_NewRef(first));
    Py_XSETREF(g_mo, Py_NewRef(mo));
    Py_XSETREF(g_cs, Py_NewRef(cs));
    Py_XSETREF(g_miss, Py_NewRef(miss));
    Py_XSETREF(g_same, Py_NewRef(same));
    Py_RETURN_NONE;
}

/* ---- the op wrapper ---------------------------------------------------------------------------------

   taped(fn, state) -> the public op (ops/tape.py's taped, without a Python frame): with no tape state
   (state[0] None) it calls fn as it was called; else state[0].call(fn, args, kw), and when that raises
   an Exception while the state was cut under the call (state.cut: another thread ended the replay or
   recording), fn as usual. It binds like a function (a method descriptor: obj.op(...) is op(obj, ...),
   with no bound method made by Python's own calls), and keeps a __dict__ for functools.update_wrapper;
   it pickles by its module and qualified name, as a function does. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn, *state, *dict;
    PyObject *bstate, *toggle;  /* a binary operator's shortcut (taped_shortcut), else NULL */
    int reflected;
} Taped;

/* toggle[0] is this module's binary itself (ops/core.py's _binary: tests put None or a wrapper there) */
static int binary_is_on(PyObject *toggle) {
    if (!PyList_CheckExact(toggle) || PyList_GET_SIZE(toggle) < 1)
        return 0;
    PyObject *f = PyList_GET_ITEM(toggle, 0);
    return PyCFunction_Check(f) && PyCFunction_GET_FUNCTION(f) == (PyCFunction)(void (*)(void))binary;
}

static PyObject *s_call, *s_cut, *s_qualname;

static PyObject *taped_vcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Taped *t = (Taped *)op;
    PyObject *s = PyList_GET_SIZE(t->state) ? PyList_GET_ITEM(t->state, 0) : Py_None;
    if (s == Py_None) {
        if (t->bstate != NULL && kwnames == NULL && PyVectorcall_NARGS(nargsf) == 2 && binary_is_on(t->toggle)) {
            /* an operator (x + y): what its Python method's op would do first, without the two frames */
            PyObject *bs = Py_NewRef(t->bstate);  /* (Python runs inside: a taped_shortcut meanwhile replaces it) */
            PyObject *r = t->reflected ? binary_of(bs, args[1], args[0]) : binary_of(bs, args[0], args[1]);
            Py_DECREF(bs);
            if (r != Py_None)
                return r;  /* (the result, or NULL: an error passed on as the op passes it on) */
            Py_DECREF(r);
        }
        return PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
    }
    Py_INCREF(s);  /* (held before anything allocates: a collection may run code that replaces it) */
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *tup = PyTuple_New(n), *kw = PyDict_New(), *r = NULL;
    if (tup == NULL || kw == NULL)
        goto out;
    for (Py_ssize_t k = 0; k < n; k++)
        PyTuple_SET_ITEM(tup, k, Py_NewRef(args[k]));
    if (kwnames != NULL)
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++)
            if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, k), args[n + k]) < 0)
                goto out;
    PyObject *cargs[4] = {s, t->fn, tup, kw};

    r = PyObject_VectorcallMethod(s_call, cargs, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyObject *et, *ev, *tb;  /* (PyErr_Fetch: the 3.11 API, still in 3.12 and 3.13) */
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *cut = PyObject_GetAttr(s, s_cut);
        int c = cut == NULL ? -1 : PyObject_IsTrue(cut);
        Py_XDECREF(cut);
        if (c > 0) {  /* run it as usual */
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            r = PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
        } else if (c == 0) {
            PyErr_Restore(et, ev, tb);
        } else {  /* (reading cut failed: that error, as Python's would) */
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
        }
    }
out:
    Py_DECREF(s);
    Py_XDECREF(tup);
    Py_XDECREF(kw);
    return r;
}

static PyObject *taped_get(PyObject *op, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(op);
    return PyMethod_New(op, obj);
}

static PyObject *taped_reduce(PyObject *op, PyObject *unused) {
    return PyObject_GetAttr(op, s_qualname);  /* (pickle: a global by module and qualified name) */
}

static PyObject *taped_repr(PyObject *op) {
    return PyObject_Repr(((Taped *)op)->fn);  /* (a user sees the op's function) */
}

static int taped_traverse(PyObject *op, visitproc visit, void *arg) {
    Taped *t = (Taped *)op;
    Py_VISIT(t->fn);
    Py_VISIT(t->state);
    Py_VISIT(t->dict);
    Py_VISIT(t->bstate);
    Py_VISIT(t->toggle);
    return 0;
}

static int taped_clear(PyObject *op) {
    Taped *t = (Taped *)op;
    Py_CLEAR(t->dict);
    return 0;  /* (fn and state stay: a call after a clear still works) */
}

static void taped_dealloc(PyObject *op) {
    Taped *t = (Taped *)op;
    PyObject_GC_UnTrack(op);
    Py_CLEAR(t->fn);
    Py_CLEAR(t->state);
    Py_CLEAR(t->dict);
    Py_CLEAR(t->bstate);
    Py_CLEAR(t->toggle);
    Py_TYPE(op)->tp_free(op);
}

static PyMethodDef taped_methods[] = {
    {"__reduce__", taped_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef taped_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TapedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_laneflow_ctape.taped",
    .tp_basicsize = sizeof(Taped),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A public op, recorded and replayed by the tape (ops/tape.py)",
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Taped, vectorcall),
    .tp_descr_get = taped_get,
    .tp_dictoffset = offsetof(Taped, dict),
    .tp_methods = taped_methods,
    .tp_getset = taped_getset,
    .tp_repr = taped_repr,
    .tp_traverse = taped_traverse,
    .tp_clear = taped_clear,
    .tp_dealloc = taped_dealloc,
};

static PyObject *taped_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "ctape.taped(fn, state list)");
        return NULL;
    }
    if (s_call == NULL) {
        if ((s_call = PyUnicode_InternFromString("call")) == NULL || (s_cut = PyUnicode_InternFromString("cut")) == NULL ||
            (s_qualname = PyUnicode_InternFromString("__qualname__")) == NULL)
            return NULL;
    }
    if (PyType_Ready(&TapedType) < 0)
        return NULL;
    Taped *t = PyObject_GC_New(Taped, &TapedType);
    if (t == NULL)
        return NULL;
    t->vectorcall = taped_vcall;
    t->fn = Py_NewRef(args[0]);
    t->state = Py_NewRef(args[1]);
    t->dict = NULL;
    t->bstate = t->toggle = NULL;
    t->reflected = 0;
    PyObject_GC_Track((PyObject *)t);
    return (PyObject *)t;
}

/* taped_shortcut(wrapper, state, reflected, toggle): a taped binary operator (Array.__add__ and its kin)
   answers its common call with binary(state, self, other) (other, self: reflected) at once while no tape
   runs and toggle[0] is binary; a declined call runs the method as before. */
static PyObject *taped_shortcut(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || Py_TYPE(args[0]) != &TapedType || !PyTuple_CheckExact(args[1]) ||
        PyTuple_GET_SIZE(args[1]) != 6 || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "ctape.taped_shortcut(taped wrapper, binary state, reflected, toggle list)");
        return NULL;
    }
    int reflected = PyObject_IsTrue(args[2]);
    if (reflected < 0)
        return NULL;
    Taped *t = (Taped *)args[0];
    Py_XSETREF(t->bstate, Py_NewRef(args[1]));
    Py_XSETREF(t->toggle, Py_NewRef(args[3]));
    t->reflected = reflected;
    Py_RETURN_NONE;
}

/* ---- an Array's finalizer ----------------------------------------------------------------------------

   array_del() -> Array.__del__ as a method descriptor: self._data.arrays -= 1, an Array whose _data was
   never set ignored (array.py's __del__, without a Python frame at each of a step's hundreds of deaths). */

static PyObject *array_del_impl(PyObject *self, PyObject *unused) {
    PyObject *d = SLOT(self, data_off);
    if (d == NULL)
        Py_RETURN_NONE;  /* (construction failed: no _data) */
    Py_INCREF(d);
    PyObject *r = NULL;
    if (Py_IS_TYPE(d, node_type)) {
        PyObject **a = &SLOT(d, node_off[ARRAYS]);
        if (*a == NULL) {
            r = Py_NewRef(Py_None);  /* (a node without the slot set: AttributeError, ignored) */
        } else {
            PyObject *w = PyNumber_Subtract(*a, one);
            if (w != NULL) {
                Py_SETREF(*a, w);
                r = Py_NewRef(Py_None);
            }
        }
    } else {  /* (another kind of value: as Python does it) */
        PyObject *old = PyObject_GetAttrString(d, "arrays");
        PyObject *w = old == NULL ? NULL : PyNumber_Subtract(old, one);
        Py_XDECREF(old);
        if (w != NULL && PyObject_SetAttrString(d, "arrays", w) == 0)
            r = Py_NewRef(Py_None);
        Py_XDECREF(w);
        if (r == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            r = Py_NewRef(Py_None);
        }
    }
    Py_DECREF(d);
    return r;
}

static PyMethodDef array_del_def = {"__del__", array_del_impl, METH_NOARGS,
                                    "Let go of the value: one array fewer binds it (ops/ctape.c)"};

static PyObject *array_del(PyObject *self, PyObject *unused) {
    if (array_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ctape: init was not called");
        return NULL;
    }
    return PyDescr_NewMethod(array_type, &array_del_def);
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(ArrayData, Array): read the slots' offsets"},
    {"init_steps", init_steps, METH_VARARGS,
     "init_steps(Replayer, Tape, tracer flag, watch, first_node, multi_output, current_stream, miss, same)"},
    {"node", (PyCFunction)(void (*)(void))node, METH_FASTCALL, "node(made, spec, prim, *inputs) -> node"},
    {"array", (PyCFunction)(void (*)(void))array, METH_FASTCALL, "array(made, spec, prim, *inputs) -> Array"},
    {"init_binary", init_binary, METH_VARARGS, "init_binary(defaults._local, defaults' dict, tracing flag, watch)"},
    {"binary", (PyCFunction)(void (*)(void))binary, METH_FASTCALL,
     "binary(state, a, b) -> the Array of a binary elementwise op's common call, or None (ops/elementwise.py)"},
    {"fresh", (PyCFunction)(void (*)(void))fresh, METH_FASTCALL,
     "fresh(prim, inputs, shape, dtype, stream) -> an Array bound to a new node (ops/core.py: node)"},
    {"same_counts", (PyCFunction)(void (*)(void))same_counts, METH_FASTCALL,
     "same_counts(made, users, held) -> whether the nodes' user counts and held flags are those recorded"},
    {"step", (PyCFunction)(void (*)(void))step_new, METH_FASTCALL,
     "step(replayer, next, spec) -> a replayed call's step (ops/tape_steps.py: _cspec)"},
    {"array_del", array_del, METH_NOARGS, "array_del() -> Array.__del__ in C (a method descriptor)"},
    {"taped", (PyCFunction)(void (*)(void))taped_new, METH_FASTCALL,
     "taped(fn, state) -> the op recorded and replayed by the tape (ops/tape.py: taped)"},
    {"taped_shortcut", (PyCFunction)(void (*)(void))taped_shortcut, METH_FASTCALL,
     "taped_shortcut(wrapper, state, reflected, toggle): a taped operator's common call in C (_array_methods.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_laneflow_ctape", NULL, -1, methods};

PyMODINIT_FUNC PyInit__laneflow_ctape(void) { return PyModule_Create(&module); }
