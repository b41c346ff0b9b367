/* One pending node's command, submitted in one C call (graph/csubmit.py loads it; graph/schedule.py's
   execute calls it for every single-output node of a one-lane stream).

   It does what the Python path does for such a node, in the same order, on the same objects:
   schedule.schedule_one (the donor of an in-place write, or backend.allocate), schedule.encode_call
   (the reads without repeats, the kernel, the Command), the encoder's one-lane fast path
   (encoder._hazards_on, the statistics, the lane's sequence number, the Point, the reader and writer
   entries), lane._enqueue(cmd), then schedule._finish. Objects are made as object.__new__ makes them
   (the type's tp_alloc) and their __slots__ filled through the slots' offsets, read once from the
   types' member descriptors (init), so they are exactly those the Python path makes.

   submit_one(d) -> True: submitted; False: nothing was done and the Python path must run it. False is
   decided before anything changes: a node of another type (LazyData), a placeholder or a constant, a
   primitive with siblings, a pinned lane or one shared allocation, a primitive reading an input
   through a view (in_views), a closed stream or one of several lanes, tracing on, an input not yet
   evaluated. When a read or write must wait for another stream's lane (the one-lane fast path does not
   apply), the command goes to the encoder's general path (encoder.submit), as in Python. */

#include "../native.h"
#include <string.h>

static PyTypeObject *node_t, *buf_t, *cmd_t, *point_t;
static PyObject *stats, *empty_tuple, *zero, *base_kernel_of;

static const char *const N_SLOTS[] = {"shape", "dtype", "device", "stream", "prim", "inputs", "siblings", "buffer",
                                "users", "arrays"};
enum { N_SHAPE, N_DTYPE, N_DEVICE, N_STREAM, N_PRIM, N_INPUTS, N_SIBLINGS, N_BUFFER, N_USERS, N_ARRAYS, N_N };
static const char *const B_SLOTS[] = {"data", "writer", "readers", "exported"};
enum { B_DATA, B_WRITER, B_READERS, B_EXPORTED, B_N };
static const char *const C_SLOTS[] = {"op", "fn", "reads", "writes", "seq", "prim", "ins", "outs"};
enum { C_OP, C_FN, C_READS, C_WRITES, C_SEQ, C_PRIM, C_INS, C_OUTS, C_N };
static const char *const P_SLOTS[] = {"lane", "seq", "clock"};
enum { P_LANE, P_SEQ, P_CLOCK, P_N };
static const char *const S_SLOTS[] = {"raw", "waw", "war", "same_lane_deps", "waits_elided"};
enum { S_RAW, S_WAW, S_WAR, S_SAME, S_ELIDED, S_N };
static Py_ssize_t n_off[N_N], b_off[B_N], c_off[C_N], p_off[P_N], s_off[S_N];
/* plain instance attributes (their types checked once: native.h) */
static const char *const STREAM_ATTRS[] = {"_closed", "backend", "encoder"};
static const char *const ENCODER_ATTRS[] = {"lanes"};
static const char *const LANE_ATTRS[] = {"clock", "submitted", "enqueue_fast"};
static const char *const PRIM_ATTRS[] = {"name", "in_views"};
static Plain stream_plain = {STREAM_ATTRS, 3, 0, {0}}, encoder_plain = {ENCODER_ATTRS, 1, 0, {0}},
             lane_plain = {LANE_ATTRS, 3, 0, {0}}, prim_plain = {PRIM_ATTRS, 2, 0, {0}};
/* a primitive type's class attributes kind, lane_for, one_allocation and donates, read once per type
   (primitives set them on the class, never on an instance): FAST (kind is neither a placeholder nor a
   constant, no pinned lane, no shared allocation) and DONATES */
enum { FAST = 1, DONATES = 2 };
static PyTypeObject *prim_types[32];
static int prim_flags[32], n_prim_types;
static unsigned int prim_tags[32];
static PyObject *tracing_dict;

static PyObject *s_kind, *s_lane_for, *s_one_allocation, *s_donates, *s_name, *s_closed, *s_backend, *s_encoder,
    *s_lanes, *s_clock, *s_submitted, *s_allocate, *s_kernel_of, *s_kernel, *s_enqueue_fast, *s_enqueue, *s_submit, *s_active, *s_in_views,
    *s_placeholder, *s_constant;

/* init(ArrayData, Buffer, Command, Point, STATS, tracing module, Backend.kernel_of) */
static PyObject *init(PyObject *self, PyObject *args) {
    PyTypeObject *nt, *bt, *ct, *pt;
    PyObject *st, *tr, *ko;
    Py_ssize_t no[N_N], bo[B_N], co[C_N], po[P_N], so[S_N];
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOO", &PyType_Type, &nt, &PyType_Type, &bt, &PyType_Type, &ct, &PyType_Type,
                          &pt, &st, &tr, &ko))
        return NULL;
    if (offsets_of(nt, N_SLOTS, N_N, no) || offsets_of(bt, B_SLOTS, B_N, bo) || offsets_of(ct, C_SLOTS, C_N, co) ||
        offsets_of(pt, P_SLOTS, P_N, po) || offsets_of(Py_TYPE(st), S_SLOTS, S_N, so))
        return NULL;
#define INTERN(v, s) if (v == NULL && (v = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(s_kind, "kind"); INTERN(s_lane_for, "lane_for"); INTERN(s_one_allocation, "one_allocation");
    INTERN(s_donates, "donates"); INTERN(s_name, "name"); INTERN(s_closed, "_closed");
    INTERN(s_backend, "backend"); INTERN(s_encoder, "encoder"); INTERN(s_lanes, "lanes");
    INTERN(s_clock, "clock"); INTERN(s_submitted, "submitted"); INTERN(s_allocate, "allocate");
    INTERN(s_kernel_of, "kernel_of"); INTERN(s_kernel, "kernel"); INTERN(s_enqueue_fast, "enqueue_fast"); INTERN(s_enqueue, "_enqueue"); INTERN(s_submit, "submit");
    INTERN(s_active, "active"); INTERN(s_in_views, "in_views"); INTERN(s_placeholder, "placeholder");
    INTERN(s_constant, "constant");
#undef INTERN
    if (empty_tuple == NULL && (empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    memcpy(n_off, no, sizeof no);
    memcpy(b_off, bo, sizeof bo);
    memcpy(c_off, co, sizeof co);
    memcpy(p_off, po, sizeof po);
    memcpy(s_off, so, sizeof so);
    if (!PyModule_Check(tr)) {
        PyErr_SetString(PyExc_TypeError, "csubmit: the tracing module");
        return NULL;
    }
    Py_XSETREF(tracing_dict, Py_NewRef(PyModule_GetDict(tr)));
    Py_XSETREF(node_t, (PyTypeObject *)Py_NewRef(nt));
    Py_XSETREF(buf_t, (PyTypeObject *)Py_NewRef(bt));
    Py_XSETREF(cmd_t, (PyTypeObject *)Py_NewRef(ct));
    Py_XSETREF(point_t, (PyTypeObject *)Py_NewRef(pt));
    Py_XSETREF(stats, Py_NewRef(st));
    Py_XSETREF(base_kernel_of, Py_NewRef(ko));
    Py_RETURN_NONE;
}

/* obj.name is None: 1, not None: 0, -1 on an error */
static int attr_is_none(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = v == Py_None;
    Py_DECREF(v);
    return r;
}

static int attr_true(PyObject *obj, PyObject *name) {  /* bool(obj.name): 1, 0, -1 */
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int slot_add(PyObject *o, Py_ssize_t off, long n) {  /* an int slot += n */
    PyObject *v = SLOT(o, off);
    long long x = v == NULL ? 0 : PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    PyObject *w = PyLong_FromLongLong(x + n);
    if (w == NULL)
        return -1;
    Py_XSETREF(SLOT(o, off), w);
    return 0;
}

static long long seq_of(PyObject *point) {  /* a Point's seq; -1 with an error set */
    PyObject *s = SLOT(point, p_off[P_SEQ]);
    if (s == NULL) {
        PyErr_SetString(PyExc_AttributeError, "csubmit: a Point without its seq");
        return -1;
    }
    return PyLong_AsLongLong(s);
}

/* Whether clock has waited for point p (a Point) of lane key: 1 yes, 0 no (or p is not a Point: the
   general path decides), -1 an error */
static int covered_by(PyObject *clock, PyObject *key, PyObject *p) {
    if (!PyObject_TypeCheck(p, point_t))
        return 0;
    PyObject *have = PyDict_GetItemWithError(clock, key); /* borrowed */
    if (have == NULL && PyErr_Occurred())
        return -1;
    long long h = have == NULL ? 0 : PyLong_AsLongLong(have);
    if (h == -1 && PyErr_Occurred())
        return -1;
    long long s = seq_of(p);
    if (s == -1 && PyErr_Occurred())
        return -1;
    return h >= s;
}

/* Writer point p (not None): 1 on lane, 2 on another lane and covered by clock, 0
   neither, -1 an error */
static int follows(PyObject *p, PyObject *lane, PyObject *clock) {
    if (!PyObject_TypeCheck(p, point_t))
        return 0;
    PyObject *pl = SLOT(p, p_off[P_LANE]);
    if (pl == lane)
        return 1;
    if (pl == NULL)
        return 0;
    int c = covered_by(clock, pl, p);
    return c <= 0 ? c : 2;
}

/* encoder._hazards_on: counts[4] = raw, waw, war, covered; 1 when every point is on lane or covered,
   0 when the general path must place the command, -1 on an error */
/* buffer b's writer, if any, as one hazard of the kind *kind counts: 1 counted (or none), else follows()'s */
static int writer_hazard(PyObject *b, PyObject *lane, PyObject *clock, long *kind, long *covered) {
    PyObject *w = SLOT(b, b_off[B_WRITER]);
    if (w == NULL || w == Py_None)
        return 1;
    int f = follows(w, lane, clock);
    if (f <= 0)
        return f;
    *covered += f == 2;
    ++*kind;
    return 1;
}

static int hazards_on(PyObject *lane, PyObject *clock, PyObject *reads, PyObject *out, long *counts) {
    long raw = 0, waw = 0, war = 0, covered = 0;
    int f;
    Py_ssize_t nr = PyList_GET_SIZE(reads);
    for (Py_ssize_t k = 0; k < nr; k++)
        if ((f = writer_hazard(PyList_GET_ITEM(reads, k), lane, clock, &raw, &covered)) <= 0)
            return f;
    if ((f = writer_hazard(out, lane, clock, &waw, &covered)) <= 0)
        return f;
    PyObject *rd = SLOT(out, b_off[B_READERS]);
    if (rd == NULL || !PyDict_Check(rd))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *rl, *p;
    while (PyDict_Next(rd, &pos, &rl, &p)) {
        if (rl != lane) {  /* (another lane's reader entry: covered by the clock, read by the entry's key) */
            int c = covered_by(clock, rl, p);
            if (c <= 0)
                return c;
            covered++;
        }
        war++;
    }
    counts[0] = raw, counts[1] = waw, counts[2] = war, counts[3] = covered;
    return 1;
}

/* schedule._donor: 1 and *src the input whose buffer output 0 may take (borrowed), 0 none, -1 an error
   (raised, as the Python path raises it: a comparison or truth test that failed) */
static int donor(PyObject *d, PyObject *ins, PyObject **src_out) {
    if (PyTuple_GET_SIZE(ins) == 0)
        return 0;
    PyObject *src = PyTuple_GET_ITEM(ins, 0);
    PyObject *buf = SLOT(src, n_off[N_BUFFER]);
    PyObject *users = SLOT(src, n_off[N_USERS]), *arrays = SLOT(src, n_off[N_ARRAYS]);
    if (users == NULL || arrays == NULL)
        return 0;
    long u = PyLong_AsLong(users), a = PyLong_AsLong(arrays);
    if (u != 1 || a != 0) {
        PyErr_Clear();  /* (an int too large for a long: not 1 nor 0) */
        return 0;
    }
    PyObject *ex = SLOT(buf, b_off[B_EXPORTED]);
    int exported = ex == NULL ? 1 : PyObject_IsTrue(ex);
    if (exported != 0)
        return exported < 0 ? -1 : 0;
    PyObject *sib = SLOT(src, n_off[N_SIBLINGS]);
    if (sib != NULL && sib != Py_None)
        return 0;
    int same = PyObject_RichCompareBool(SLOT(src, n_off[N_SHAPE]), SLOT(d, n_off[N_SHAPE]), Py_EQ);
    if (same != 1)
        return same;
    same = PyObject_RichCompareBool(SLOT(src, n_off[N_DTYPE]), SLOT(d, n_off[N_DTYPE]), Py_EQ);
    if (same != 1)
        return same;
    /* (reads_view(prim, 0) is false: submit_one leaves a primitive with in_views to the Python path) */
    *src_out = src;
    return 1;
}

static PyObject *new_of(PyTypeObject *t) {  /* object.__new__(t), its slots empty */
    return t->tp_alloc(t, 0);
}

static int add_stat(int k, long n) { return n ? slot_add(stats, s_off[k], n) : 0; }

/* the FAST and DONATES flags of prim's type; -1 on an error. Kept per type while its version tag holds
   (a class attribute assigned later changes the tag: CPython's type attribute cache works so) */
static int flags_of(PyObject *prim) {
    PyTypeObject *t = Py_TYPE(prim);
    int slot = -1;
    for (int i = 0; i < n_prim_types; i++)
        if (prim_types[i] == t) {
            if (t->tp_version_tag != 0 && prim_tags[i] == t->tp_version_tag)
                return prim_flags[i];
            slot = i;
            break;
        }
    PyObject *kind = PyObject_GetAttr((PyObject *)t, s_kind);
    if (kind == NULL)
        return -1;
    int other = !PyUnicode_Check(kind) || PyUnicode_Compare(kind, s_placeholder) == 0 ||
                PyUnicode_Compare(kind, s_constant) == 0;
    Py_DECREF(kind);
    int pinned = attr_is_none((PyObject *)t, s_lane_for);
    if (pinned < 0)
        return -1;
    int shared = attr_true((PyObject *)t, s_one_allocation);
    if (shared < 0)
        return -1;
    int donates = attr_true((PyObject *)t, s_donates);
    if (donates < 0)
        return -1;
    int f = (!other && pinned == 1 && shared == 0 ? FAST : 0) | (donates ? DONATES : 0);
    if (slot < 0 && n_prim_types < 32) {
        slot = n_prim_types++;
        prim_types[slot] = (PyTypeObject *)Py_NewRef(t);
    }
    if (slot >= 0) {
        prim_flags[slot] = f;
        prim_tags[slot] = t->tp_version_tag;  /* (0: not valid, read again next time) */
    }
    return f;
}

/* What submit_one reads before changing anything (borrowed references, d keeps them alive) */
typedef struct {
    PyObject *prim, *pd, *ins, *stream, *sd, *lane, *ld;
    int flags;
} Node;

/* The checks that come before any change: 1 the fast path applies, 0 not, -1 an error */
static int applies(PyObject *d, Node *n) {
    PyObject *sib = SLOT(d, n_off[N_SIBLINGS]);
    if (sib != NULL && sib != Py_None)
        return 0;
    n->flags = flags_of(n->prim);
    if (n->flags < 0)
        return -1;
    if (!(n->flags & FAST))
        return 0;
    n->pd = plain_dict(n->prim, &prim_plain);
    if (n->pd == NULL)
        return 0;
    PyObject *vs = DGET(n->pd, s_in_views);
    if (vs != NULL && vs != Py_None)
        return 0;  /* (a primitive reading an input through a view: the Python path) */
    if (vs == NULL && PyErr_Occurred())
        return -1;
    n->ins = SLOT(d, n_off[N_INPUTS]);
    if (n->ins == NULL || !PyTuple_CheckExact(n->ins))
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(n->ins); k++) {
        PyObject *i = PyTuple_GET_ITEM(n->ins, k);
        if (Py_TYPE(i) != node_t)
            return 0;
        PyObject *b = SLOT(i, n_off[N_BUFFER]);
        if (b == NULL || !PyObject_TypeCheck(b, buf_t))
            return 0;
        for (int j = 0; j < B_N; j++)
            if (SLOT(b, b_off[j]) == NULL)
                return 0;
        PyObject *sh = SLOT(i, n_off[N_SHAPE]), *dt = SLOT(i, n_off[N_DTYPE]);
        if (sh == NULL || dt == NULL || SLOT(i, n_off[N_USERS]) == NULL || SLOT(i, n_off[N_ARRAYS]) == NULL)
            return 0;
    }
    PyObject *active = DGET(tracing_dict, s_active);
    if (active != Py_None) {  /* (tracing on, or no such name: the Python path) */
        PyErr_Clear();
        return 0;
    }
    n->stream = SLOT(d, n_off[N_STREAM]);
    if (n->stream == NULL || SLOT(d, n_off[N_SHAPE]) == NULL || SLOT(d, n_off[N_DTYPE]) == NULL ||
        SLOT(d, n_off[N_DEVICE]) == NULL || (n->sd = plain_dict(n->stream, &stream_plain)) == NULL)
        return 0;
    PyObject *closed = DGET(n->sd, s_closed), *enc = DGET(n->sd, s_encoder);
    if (closed != Py_False || enc == NULL || DGET(n->sd, s_backend) == NULL) {
        PyErr_Clear();
        return 0;  /* (a closed stream: the Python path raises) */
    }
    PyObject *ed = plain_dict(enc, &encoder_plain);
    PyObject *lanes = ed == NULL ? NULL : DGET(ed, s_lanes);
    if (lanes == NULL || !PyList_CheckExact(lanes) || PyList_GET_SIZE(lanes) != 1) {
        PyErr_Clear();
        return 0;
    }
    n->lane = PyList_GET_ITEM(lanes, 0);
    n->ld = plain_dict(n->lane, &lane_plain);
    if (n->ld == NULL)
        return 0;
    PyObject *clock = DGET(n->ld, s_clock), *sub = DGET(n->ld, s_submitted);
    if (clock == NULL || !PyDict_CheckExact(clock) || sub == NULL || !PyLong_CheckExact(sub)) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static PyObject *submit_one(PyObject *self, PyObject *d) {
    if (node_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "csubmit: init was not called");
        return NULL;
    }
    if (Py_TYPE(d) != node_t)
        Py_RETURN_FALSE;
    Node n = {SLOT(d, n_off[N_PRIM])};
    if (n.prim == NULL || n.prim == Py_None)
        Py_RETURN_FALSE;
    int ok = applies(d, &n);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_False);
    /* from here on, references of our own: d's slots change below, and Python code runs (allocate, the
       kernel table, the lane) */
    PyObject *prim = Py_NewRef(n.prim), *ins = Py_NewRef(n.ins), *lane = Py_NewRef(n.lane);
    PyObject *stream = Py_NewRef(n.stream), *backend = Py_NewRef(DGET(n.sd, s_backend));
    PyObject *name = DGET(n.pd, s_name);
    PyObject *out = NULL, *reads = NULL, *in_data = NULL, *out_data = NULL, *writes = NULL;
    PyObject *kern = NULL, *cmd = NULL, *point = NULL, *clock = NULL, *res = NULL;
    Py_ssize_t n_in = PyTuple_GET_SIZE(ins);
    if (name == NULL) {  /* (a primitive's name: Primitive.__init__ sets it) */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "csubmit: a primitive without a name");
        goto done;
    }
    Py_INCREF(name);

    /* the output: the donor's buffer (an in-place write), or a new one (schedule.submit) */
    PyObject *src = NULL;
    if ((n.flags & DONATES) && donor(d, ins, &src) < 0)
        goto done;
    if (src != NULL) {
        out = Py_NewRef(SLOT(src, n_off[N_BUFFER]));
    } else {
        PyObject *a[5] = {backend, SLOT(d, n_off[N_DEVICE]), SLOT(d, n_off[N_SHAPE]), SLOT(d, n_off[N_DTYPE]), name};
        out = PyObject_VectorcallMethod(s_allocate, a, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (out == NULL)
            goto done;
        if (!PyObject_TypeCheck(out, buf_t) || SLOT(out, b_off[B_DATA]) == NULL || SLOT(out, b_off[B_READERS]) == NULL) {
            PyErr_SetString(PyExc_TypeError, "csubmit: backend.allocate did not return a Buffer");
            goto done;
        }
    }

    /* schedule.encode_call: the reads without repeats (first occurrences, in order), the data handles */
    reads = PyList_New(0);
    in_data = PyList_New(n_in);
    if (reads == NULL || in_data == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n_in; k++) {
        PyObject *b = SLOT(PyTuple_GET_ITEM(ins, k), n_off[N_BUFFER]);
        PyList_SET_ITEM(in_data, k, Py_NewRef(SLOT(b, b_off[B_DATA])));
        int seen = 0;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(reads) && !seen; j++)
            seen = PyList_GET_ITEM(reads, j) == b;
        if (!seen && PyList_Append(reads, b) < 0)
            goto done;
    }
    out_data = PyList_New(1);
    writes = PyList_New(1);
    if (out_data == NULL || writes == NULL)
        goto done;
    PyList_SET_ITEM(out_data, 0, Py_NewRef(SLOT(out, b_off[B_DATA])));
    PyList_SET_ITEM(writes, 0, Py_NewRef(out));
    if (_PyType_Lookup(Py_TYPE(backend), s_kernel_of) == base_kernel_of) {
        /* Backend.kernel_of(prim) is backend.kernel(prim.kind) for a primitive without in_views */
        PyObject *kind = PyObject_GetAttr(prim, s_kind);
        if (kind == NULL)
            goto done;
        PyObject *a[2] = {backend, kind};
        kern = PyObject_VectorcallMethod(s_kernel, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(kind);
    } else {  /* (a backend's own kernel_of) */
        PyObject *a[2] = {backend, prim};
        kern = PyObject_VectorcallMethod(s_kernel_of, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    if (kern == NULL)
        goto done;
    cmd = new_of(cmd_t);
    if (cmd == NULL)
        goto done;
    SLOT(cmd, c_off[C_OP]) = Py_NewRef(name);
    SLOT(cmd, c_off[C_FN]) = Py_NewRef(kern);
    SLOT(cmd, c_off[C_READS]) = Py_NewRef(reads);
    SLOT(cmd, c_off[C_WRITES]) = Py_NewRef(writes);
    SLOT(cmd, c_off[C_SEQ]) = Py_NewRef(zero);
    SLOT(cmd, c_off[C_PRIM]) = Py_NewRef(prim);
    SLOT(cmd, c_off[C_INS]) = Py_NewRef(in_data);
    SLOT(cmd, c_off[C_OUTS]) = Py_NewRef(out_data);

    /* the encoder: its one-lane fast path here, else its general path (encoder.submit); the lane's
       dict is read again: allocate and the kernel table ran Python */
    PyObject *ld = plain_dict(lane, &lane_plain);
    clock = ld == NULL ? NULL : DGET(ld, s_clock);
    long counts[4];
    int fast = clock != NULL && PyDict_CheckExact(clock) ? hazards_on(lane, clock, reads, out, counts) : 0;
    Py_XINCREF(clock);
    if (fast < 0)
        goto done;
    if (!fast) {
        PyErr_Clear();
        PyObject *enc = PyObject_GetAttr(stream, s_encoder);
        if (enc == NULL)
            goto done;
        PyObject *a[2] = {enc, cmd};
        PyObject *pt = PyObject_VectorcallMethod(s_submit, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(enc);
        if (pt == NULL)
            goto done;
        Py_DECREF(pt);
    } else {
        long raw = counts[0], waw = counts[1], war = counts[2], covered = counts[3];
        if (add_stat(S_RAW, raw) || add_stat(S_WAW, waw) || add_stat(S_WAR, war) ||
            add_stat(S_SAME, raw + waw + war - covered) || add_stat(S_ELIDED, covered))
            goto done;
        PyObject *sub = DGET(ld, s_submitted);
        long long prev = sub == NULL ? -1 : PyLong_AsLongLong(sub);
        if (prev < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "csubmit: a lane without its count");
            goto done;
        }
        PyObject *seq = PyLong_FromLongLong(prev + 1);
        if (seq == NULL || PyDict_SetItem(ld, s_submitted, seq) < 0) {
            Py_XDECREF(seq);
            goto done;
        }
        Py_SETREF(SLOT(cmd, c_off[C_SEQ]), seq);  /* (cmd holds it now) */
        point = new_of(point_t);
        if (point == NULL)
            goto done;
        SLOT(point, p_off[P_LANE]) = Py_NewRef(lane);
        SLOT(point, p_off[P_SEQ]) = Py_NewRef(seq);
        SLOT(point, p_off[P_CLOCK]) = Py_NewRef(clock);
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(reads); k++) {
            PyObject *rd = SLOT(PyList_GET_ITEM(reads, k), b_off[B_READERS]);
            if (PyObject_SetItem(rd, lane, point) < 0)
                goto done;
        }
        Py_XSETREF(SLOT(out, b_off[B_WRITER]), Py_NewRef(point));
        PyObject *rd = SLOT(out, b_off[B_READERS]);
        int nonempty = PyObject_IsTrue(rd);
        if (nonempty < 0)
            goto done;
        if (nonempty) {
            PyObject *fresh = PyDict_New();
            if (fresh == NULL)
                goto done;
            Py_XSETREF(SLOT(out, b_off[B_READERS]), fresh);
        }
        /* the lane's enqueue_fast (a C enqueue: backends/cuda/cenqueue.c) when it has one and takes the
           command, else lane._enqueue(cmd) */
        PyObject *a[2] = {lane, cmd};
        PyObject *fast_enqueue = DGET(ld, s_enqueue_fast), *r = NULL;
        if (fast_enqueue != NULL && fast_enqueue != Py_None) {
            r = PyObject_Vectorcall(fast_enqueue, a, 2, NULL);
            if (r == NULL)
                goto done;
            int taken = r == Py_True;
            if (!taken && r != Py_False) {
                Py_DECREF(r);
                PyErr_SetString(PyExc_TypeError, "csubmit: a lane's enqueue_fast returned neither True nor False");
                goto done;
            }
            Py_DECREF(r);
            r = taken ? Py_NewRef(Py_None) : NULL;
        } else if (PyErr_Occurred()) {
            goto done;
        }
        if (r == NULL)
            r = PyObject_VectorcallMethod(s_enqueue, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }

    /* schedule._finish */
    for (Py_ssize_t k = 0; k < n_in; k++)
        if (slot_add(PyTuple_GET_ITEM(ins, k), n_off[N_USERS], -1))
            goto done;
    Py_XSETREF(SLOT(d, n_off[N_BUFFER]), Py_NewRef(out));
    Py_XSETREF(SLOT(d, n_off[N_PRIM]), Py_NewRef(Py_None));
    Py_XSETREF(SLOT(d, n_off[N_INPUTS]), Py_NewRef(empty_tuple));
    Py_XSETREF(SLOT(d, n_off[N_SIBLINGS]), Py_NewRef(Py_None));
    res = Py_NewRef(Py_True);
done:
    Py_DECREF(prim);
    Py_DECREF(ins);
    Py_DECREF(lane);
    Py_DECREF(stream);
    Py_DECREF(backend);
    Py_XDECREF(name);
    Py_XDECREF(out);
    Py_XDECREF(reads);
    Py_XDECREF(in_data);
    Py_XDECREF(out_data);
    Py_XDECREF(writes);
    Py_XDECREF(kern);
    Py_XDECREF(cmd);
    Py_XDECREF(point);
    Py_XDECREF(clock);
    return res;
}

/* run(items, start) -> the index of the first item from start on that Python must schedule: schedule.execute's
   loop over a run of plain nodes, each through submit_one (a node with a buffer already, produced by a sibling,
   is skipped). It stops at an item that is not an ArrayData (a group, a fused node) or a node submit_one
   declines; len(items) when it got through all. */
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "csubmit.run(items list, start int)");
        return NULL;
    }
    PyObject *items = args[0];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "csubmit.run: a negative start");
        return NULL;
    }
    while (i < PyList_GET_SIZE(items)) {
        PyObject *d = PyList_GET_ITEM(items, i);
        if (Py_TYPE(d) != node_t)
            break;
        PyObject *b = SLOT(d, n_off[N_BUFFER]);
        if (b != NULL && b != Py_None) {
            i++;
            continue;
        }
        Py_INCREF(d);  /* (Python runs inside: the list keeps it, but not by contract) */
        PyObject *r = submit_one(self, d);
        Py_DECREF(d);
        if (r == NULL)
            return NULL;
        int done = r == Py_True;
        Py_DECREF(r);
        if (!done)
            break;
        i++;
    }
    return PyLong_FromSsize_t(i);
}

/* toposort(roots, LazyData) -> the pending nodes reachable from roots, inputs before users: schedule.py's
   depth-first search in C, the same order (a node is emitted once all its pending inputs are; a LazyData
   or a node with a buffer is not pending). None when a root or an input is neither an ArrayData nor a
   LazyData, or a node's inputs are not a tuple: the Python search runs. Nothing here runs Python code
   (the seen set hashes nodes by identity), so the nodes and their input tuples stay as they were. */
typedef struct { PyObject *d, *ins; Py_ssize_t k; } Frame;

static int pending(PyObject *x, PyTypeObject *lazy_t) {  /* 1 pending, 0 not, -1 not a node */
    if (Py_TYPE(x) == lazy_t)
        return 0;
    if (Py_TYPE(x) != node_t)
        return -1;
    PyObject *b = SLOT(x, n_off[N_BUFFER]);
    PyObject *ins = SLOT(x, n_off[N_INPUTS]);
    if (ins == NULL || !PyTuple_CheckExact(ins))
        return -1;
    return b == NULL || b == Py_None;
}

/* Whether to visit x: 1 pending and not seen yet (now marked seen), 0 not, -1 an error, -2 not covered */
static int visit(PyObject *x, PyTypeObject *lazy_t, PyObject *seen) {
    int p = pending(x, lazy_t);
    if (p <= 0)
        return p < 0 ? -2 : 0;
    int in = PySet_Contains(seen, x);
    if (in != 0)
        return in < 0 ? -1 : 0;
    return PySet_Add(seen, x) < 0 ? -1 : 1;
}

static PyObject *toposort(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (node_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "csubmit: init was not called");
        return NULL;
    }
    if (nargs != 2 || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "csubmit.toposort(roots, LazyData)");
        return NULL;
    }
    PyTypeObject *lazy_t = (PyTypeObject *)args[1];
    PyObject *roots = PySequence_Fast(args[0], "csubmit.toposort: roots must be a sequence");
    if (roots == NULL)
        return NULL;
    PyObject *order = PyList_New(0), *seen = PySet_New(NULL), *res = NULL;
    Py_ssize_t cap = 64, top = 0;
    Frame *stack = PyMem_Malloc(cap * sizeof(Frame));
    if (order == NULL || seen == NULL || stack == NULL) {
        if (stack == NULL)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(roots); r++) {
        PyObject *root = PySequence_Fast_GET_ITEM(roots, r);
        int v = visit(root, lazy_t, seen);
        if (v < 0) {
            res = v == -2 ? Py_NewRef(Py_None) : NULL;
            goto done;
        }
        if (!v)
            continue;
        stack[0] = (Frame){root, SLOT(root, n_off[N_INPUTS]), 0};
        top = 1;
        while (top > 0) {
            Frame *f = &stack[top - 1];
            Py_ssize_t n = PyTuple_GET_SIZE(f->ins);
            PyObject *next = NULL;
            while (f->k < n) {
                PyObject *i = PyTuple_GET_ITEM(f->ins, f->k);
                f->k++;
                int v = visit(i, lazy_t, seen);
                if (v < 0) {
                    res = v == -2 ? Py_NewRef(Py_None) : NULL;
                    goto done;
                }
                if (v) {
                    next = i;
                    break;
                }
            }
            if (next != NULL) {
                if (top == cap) {
                    Frame *grown = PyMem_Realloc(stack, 2 * cap * sizeof(Frame));
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    stack = grown;
                    cap *= 2;
                }
                stack[top++] = (Frame){next, SLOT(next, n_off[N_INPUTS]), 0};
            } else {
                top--;
                if (PyList_Append(order, f->d) < 0)
                    goto done;
            }
        }
    }
    res = Py_NewRef(order);
done:
    PyMem_Free(stack);
    Py_DECREF(roots);
    Py_XDECREF(order);
    Py_XDECREF(seen);
    return res;
}

/* kinds(items) -> the set of the kinds of the items' primitives (their types' ``kind``), or None where an
   item is not a node with a primitive or past 32 types: schedule.passes skips a pass with nothing of its
   kinds to work on. Nothing runs Python code until the types are read (each held by the list ts). */
static PyObject *kinds(PyObject *self, PyObject *items) {
    if (node_t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "csubmit: init was not called");
        return NULL;
    }
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "csubmit.kinds(items list)");
        return NULL;
    }
    PyTypeObject *seen[32];
    int n = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *d = PyList_GET_ITEM(items, i);
        PyObject *prim = Py_TYPE(d) == node_t ? SLOT(d, n_off[N_PRIM]) : NULL;
        if (prim == NULL || prim == Py_None)
            Py_RETURN_NONE;
        PyTypeObject *t = Py_TYPE(prim);
        int k = n - 1;
        while (k >= 0 && seen[k] != t)
            k--;
        if (k >= 0)
            continue;
        if (n == 32)
            Py_RETURN_NONE;
        seen[n++] = t;
    }
    PyObject *ts = PyList_New(n), *out = PySet_New(NULL);
    if (ts == NULL || out == NULL)
        goto fail;
    for (int k = 0; k < n; k++)
        PyList_SET_ITEM(ts, k, Py_NewRef((PyObject *)seen[k]));
    for (int k = 0; k < n; k++) {
        PyObject *kind = PyObject_GetAttr(PyList_GET_ITEM(ts, k), s_kind);
        if (kind == NULL || PySet_Add(out, kind) < 0) {
            Py_XDECREF(kind);
            goto fail;
        }
        Py_DECREF(kind);
    }
    Py_DECREF(ts);
    return out;
fail:
    Py_XDECREF(ts);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(ArrayData, Buffer, Command, Point, STATS, tracing module, Backend.kernel_of)"},
    {"submit_one", submit_one, METH_O, "submit_one(node) -> True (submitted) or False (the Python path runs it)"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(items, start) -> the index of the first item Python must schedule (schedule.execute's loop)"},
    {"toposort", (PyCFunction)(void (*)(void))toposort, METH_FASTCALL,
     "toposort(roots, LazyData) -> pending nodes, inputs first (schedule.toposort's search), or None"},
    {"kinds", kinds, METH_O, "kinds(items) -> the set of the items' primitives' kinds, or None (schedule.passes)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_laneflow_csubmit", NULL, -1, methods};

PyMODINIT_FUNC PyInit__laneflow_csubmit(void) { return PyModule_Create(&module); }
