/* A GPU lane's enqueue of a kernel's command in C (backends/cuda/cenqueue.py loads it; a CudaLane keeps it
   as enqueue_fast, which graph/csubmit.c calls before lane._enqueue).

   enqueue(lane, cmd) -> True: it did what CudaLane._enqueue does for the command (lanes.py), in the same
   order: the frees that died since collected (Memory.collect and collect_foreign, Python calls, when there
   are any), the outputs' host copies dropped and their memory allocated on the lane (a block of the lane's
   free list taken here, else memory.allocate), the
   command run as Command.run runs it (the kernel, fn(lane, prim, ins, outs); then the device-side checks it
   registered bound, through Command.bind_found, and the outputs' error cleared and checks set; a failure,
   Command.fail), then the fence told (EventFence.mark: an event recorded after every MARK_EVERY-th
   command, through EventFence._record_now). False: nothing was done but the frees, and CudaLane._enqueue
   must run it.

   It declines (False) all but the common case: a command of a primitive, its context current on this
   thread, no injected delays, tracing off, and inputs that carry no error and no pending check and, like
   the outputs, are device memory.

   Why: an uncached command's enqueue was four Python frames (_enqueue, Command.run, mark,
   ensure_current). */

#include "../../native.h"

static PyTypeObject *cmd_t, *buf_t, *array_t, *slab_t, *fence_t;
static PyObject *tls, *delays_dict, *tracing_dict, *lanes_dict, *laneflow_error;
static const char *const C_SLOTS[] = {"op", "fn", "reads", "writes", "seq", "prim", "ins", "outs"};
enum { C_OP, C_FN, C_READS, C_WRITES, C_SEQ, C_PRIM, C_INS, C_OUTS, C_N };
static const char *const B_SLOTS[] = {"data", "error", "checks"};
enum { B_DATA, B_ERROR, B_CHECKS, B_N };
static const char *const A_SLOTS[] = {"ptr", "nbytes", "host"};
enum { A_PTR, A_NBYTES, A_HOST, A_N };
static const char *const F_SLOTS[] = {"_last", "_marked"};
enum { F_LAST, F_MARKED, F_N };
static Py_ssize_t c_off[C_N], b_off[B_N], a_off[A_N], f_off[F_N];
static const char *const LANE_ATTRS[] = {"ctx", "handle", "fence", "checks", "blocks", "cached"};
static const char *const CTX_ATTRS[] = {"memory"};
static const char *const MEM_ATTRS[] = {"pending", "waiting", "retired", "foreign", "capture"};
static Plain lane_plain = {LANE_ATTRS, 6, 0, {0}}, ctx_plain = {CTX_ATTRS, 1, 0, {0}},
             mem_plain = {MEM_ATTRS, 5, 0, {0}};
static PyObject *s_ctx, *s_handle, *s_fence, *s_checks, *s_memory, *s_pending, *s_waiting, *s_retired, *s_foreign,
    *s_current, *s_hook, *s_active, *s_mark_every, *s_record_now, *s_allocate, *s_fail, *s_collect,
    *s_collect_foreign, *s_bind_found, *s_blocks, *s_cached, *s_capture;

/* The raised exception, taken (a new reference), and raising it again (3.11 has no
   PyErr_GetRaisedException) */
static PyObject *take_exc(void) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
}

static void raise_exc(PyObject *v) {  /* (steals v) */
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(v)), v, PyException_GetTraceback(v));
}

/* init(Command, Buffer, DeviceArray, SlabArray, EventFence, driver._tls, delays, tracing, lanes module,
        LaneflowError) */
static PyObject *init(PyObject *self, PyObject *args) {
    PyTypeObject *ct, *bt, *at, *st, *ft;
    PyObject *t, *dm, *tm, *lm, *le;
    Py_ssize_t co[C_N], bo[B_N], ao[A_N], fo[F_N];
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OO!O!O!O", &PyType_Type, &ct, &PyType_Type, &bt, &PyType_Type, &at,
                          &PyType_Type, &st, &PyType_Type, &ft, &t, &PyModule_Type, &dm, &PyModule_Type, &tm, &PyModule_Type, &lm,
                          &le))
        return NULL;
    if (offsets_of(ct, C_SLOTS, C_N, co) || offsets_of(bt, B_SLOTS, B_N, bo) || offsets_of(at, A_SLOTS, A_N, ao) ||
        offsets_of(ft, F_SLOTS, F_N, fo))
        return NULL;
#define INTERN(v, s) if (v == NULL && (v = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(s_ctx, "ctx"); INTERN(s_handle, "handle"); INTERN(s_fence, "fence"); INTERN(s_checks, "checks");
    INTERN(s_memory, "memory"); INTERN(s_pending, "pending"); INTERN(s_waiting, "waiting");
    INTERN(s_retired, "retired"); INTERN(s_foreign, "foreign"); INTERN(s_current, "current");
    INTERN(s_hook, "_hook"); INTERN(s_active, "active"); INTERN(s_mark_every, "MARK_EVERY");
    INTERN(s_record_now, "_record_now"); INTERN(s_allocate, "allocate"); INTERN(s_fail, "fail");
    INTERN(s_collect, "collect"); INTERN(s_collect_foreign, "collect_foreign"); INTERN(s_bind_found, "bind_found");
    INTERN(s_blocks, "blocks"); INTERN(s_cached, "cached"); INTERN(s_capture, "capture");
#undef INTERN
    memcpy(c_off, co, sizeof co);
    memcpy(b_off, bo, sizeof bo);
    memcpy(a_off, ao, sizeof ao);
    memcpy(f_off, fo, sizeof fo);
    Py_XSETREF(cmd_t, (PyTypeObject *)Py_NewRef(ct));
    Py_XSETREF(buf_t, (PyTypeObject *)Py_NewRef(bt));
    Py_XSETREF(array_t, (PyTypeObject *)Py_NewRef(at));
    Py_XSETREF(slab_t, (PyTypeObject *)Py_NewRef(st));
    Py_XSETREF(fence_t, (PyTypeObject *)Py_NewRef(ft));
    Py_XSETREF(tls, Py_NewRef(t));
    Py_XSETREF(delays_dict, Py_NewRef(PyModule_GetDict(dm)));
    Py_XSETREF(tracing_dict, Py_NewRef(PyModule_GetDict(tm)));
    Py_XSETREF(lanes_dict, Py_NewRef(PyModule_GetDict(lm)));
    Py_XSETREF(laneflow_error, Py_NewRef(le));
    Py_RETURN_NONE;
}

static int is_true(PyObject *d, PyObject *name) {  /* bool(d[name]): 1, 0; -1 when missing or an error */
    PyObject *v = DGET(d, name);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    int r = PyObject_IsTrue(v);
    if (r < 0)
        PyErr_Clear();
    return r;
}

/* All of cmd's buffers in list `bufs` are Buffers whose data are DeviceArrays or SlabArrays (exactly: a
   subclass may put a property over a slot), all slots set; for reads, with no error and no pending check */
static int plain_buffers(PyObject *bufs, int reads) {
    if (bufs == NULL || !PyList_CheckExact(bufs))
        return 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(bufs); k++) {
        PyObject *b = PyList_GET_ITEM(bufs, k);
        if (!PyObject_TypeCheck(b, buf_t))
            return 0;
        for (int j = 0; j < B_N; j++)
            if (SLOT(b, b_off[j]) == NULL)
                return 0;
        if (reads && (SLOT(b, b_off[B_ERROR]) != Py_None || SLOT(b, b_off[B_CHECKS]) != Py_None))
            return 0;
        PyObject *h = SLOT(b, b_off[B_DATA]);
        if (Py_TYPE(h) != array_t && Py_TYPE(h) != slab_t)
            return 0;  /* (host memory a CPU lane writes: the Python path waits for it; a view of memory) */
        for (int j = 0; j < A_N; j++)
            if (SLOT(h, a_off[j]) == NULL)
                return 0;
    }
    return 1;
}

/* Memory.allocate's common case for output data h (memory.py: Memory.take), in C: a block of exactly
   h.nbytes from the lane's free list (ld: its dict), which its stream order makes free, with no driver
   call. 1 taken (h.ptr set), 0 not (no such block, a slab, a graph being captured: memory.allocate runs),
   -1 an error raised. No lock: nothing here lets another thread run (Memory.take's lock guards its
   look and its pop, which Python may run apart). */
static int take_cached(PyObject *ld, PyObject *md, PyObject *h) {
    if (Py_TYPE(h) != array_t)
        return 0;
    PyObject *cap = DGET(md, s_capture), *blocks = DGET(ld, s_blocks), *cached = DGET(ld, s_cached);
    if (cap != Py_None || blocks == NULL || !PyDict_CheckExact(blocks) || cached == NULL || !PyLong_CheckExact(cached)) {
        PyErr_Clear();
        return 0;
    }
    PyObject *nbytes = SLOT(h, a_off[A_NBYTES]);
    if (!PyLong_CheckExact(nbytes))
        return 0;
    PyObject *list = DGET(blocks, nbytes);
    if (list == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t n = PyList_CheckExact(list) ? PyList_GET_SIZE(list) : 0;
    if (n == 0)
        return 0;
    PyObject *left = PyNumber_Subtract(cached, nbytes);
    if (left == NULL)
        return -1;
    int bad = PyDict_SetItem(ld, s_cached, left);
    Py_DECREF(left);
    if (bad < 0)
        return -1;
    PyObject *ptr = Py_NewRef(PyList_GET_ITEM(list, n - 1));
    if (PyList_SetSlice(list, n - 1, n, NULL) < 0) {
        Py_DECREF(ptr);
        return -1;
    }
    Py_SETREF(SLOT(h, a_off[A_PTR]), ptr);
    return 1;
}

/* Call mem.<name>() when `want`; 0, or -1 with an error raised */
static int call_if(int want, PyObject *mem, PyObject *name) {
    if (!want)
        return 0;
    PyObject *r = PyObject_CallMethodNoArgs(mem, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* 1 done, 0 declined (nothing done but the frees collected; no error set), -1 an error raised */
static int enqueue_(PyObject *lane, PyObject *cmd) {
    if (Py_TYPE(cmd) != cmd_t)
        return 0;
    for (int j = 0; j < C_N; j++)
        if (SLOT(cmd, c_off[j]) == NULL)
            return 0;
    if (SLOT(cmd, c_off[C_PRIM]) == Py_None)
        return 0;  /* (a closure's command, fn(lane): the Python path) */
    PyObject *ld = plain_dict(lane, &lane_plain);
    PyObject *ctx = ld == NULL ? NULL : DGET(ld, s_ctx), *handle = ld == NULL ? NULL : DGET(ld, s_handle);
    PyObject *fence = ld == NULL ? NULL : DGET(ld, s_fence);
    if (ctx == NULL || handle == NULL || fence == NULL || Py_TYPE(fence) != fence_t ||
        SLOT(fence, f_off[F_LAST]) == NULL || SLOT(fence, f_off[F_MARKED]) == NULL) {
        PyErr_Clear();
        return 0;
    }
    /* ctx.ensure_current(), when it is current already; no delays; no tracing */
    PyObject *cur = PyObject_GetAttr(tls, s_current);
    if (cur == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(cur);
    if (cur != ctx)
        return 0;
    PyObject *cd = plain_dict(ctx, &ctx_plain), *mem = cd == NULL ? NULL : DGET(cd, s_memory);
    PyObject *md = mem == NULL ? NULL : plain_dict(mem, &mem_plain);
    if (md == NULL || DGET(delays_dict, s_hook) != Py_None || DGET(tracing_dict, s_active) != Py_None) {
        PyErr_Clear();
        return 0;
    }
    int pending = is_true(md, s_pending), waiting = is_true(md, s_waiting), retired = is_true(md, s_retired);
    int foreign = is_true(md, s_foreign);
    if (pending < 0 || waiting < 0 || retired < 0 || foreign < 0)
        return 0;
    if (!plain_buffers(SLOT(cmd, c_off[C_READS]), 1) || !plain_buffers(SLOT(cmd, c_off[C_WRITES]), 0))
        return 0;
    PyObject *every = DGET(lanes_dict, s_mark_every);
    long mark_every = every == NULL ? -1 : PyLong_AsLong(every);
    if (mark_every < 1) {
        PyErr_Clear();
        return 0;
    }

    /* from here on, CudaLane._enqueue; everything read above is held or read again after Python ran */
    PyObject *hold[7] = {Py_NewRef(cmd), Py_NewRef(lane), Py_NewRef(fence), Py_NewRef(mem), Py_NewRef(ctx), Py_NewRef(ld),
                         Py_NewRef(md)};
    PyObject *writes = NULL, *found = NULL, *checks = NULL, *args[4] = {NULL, NULL, NULL, NULL};
    int res = -1, failed = 0;
    /* the frees that died since the last command (Memory.collect, collect_foreign); Python ran when there
       were any: what it may have changed is looked at again */
    if (pending || waiting || retired || foreign) {
        if (call_if(pending || waiting || retired, mem, s_collect) < 0 || call_if(foreign, mem, s_collect_foreign) < 0)
            goto done;
        cur = PyObject_GetAttr(tls, s_current);
        if (cur == NULL)
            goto done;
        Py_DECREF(cur);
        if (cur != ctx || !plain_buffers(SLOT(cmd, c_off[C_READS]), 1) || !plain_buffers(SLOT(cmd, c_off[C_WRITES]), 0)) {
            res = 0;  /* (changed while the frees were collected: the Python path) */
            goto done;
        }
    }
    /* the outputs' memory (an allocation failure fails the outputs, as there) */
    writes = Py_NewRef(SLOT(cmd, c_off[C_WRITES]));
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(writes) && !failed; k++) {
        PyObject *h = Py_NewRef(SLOT(PyList_GET_ITEM(writes, k), b_off[B_DATA]));  /* (held: Python runs) */
        Py_SETREF(SLOT(h, a_off[A_HOST]), Py_NewRef(Py_None));
        int unset = PyObject_Not(SLOT(h, a_off[A_PTR])), empty = PyObject_Not(SLOT(h, a_off[A_NBYTES]));
        if (unset < 0 || empty < 0) {
            Py_DECREF(h);
            goto done;
        }
        int took = unset && !empty ? take_cached(ld, md, h) : 1;  /* (1: nothing to allocate) */
        if (took < 0) {
            Py_DECREF(h);
            goto done;
        }
        if (!took) {
            PyObject *op = Py_NewRef(SLOT(cmd, c_off[C_OP]));
            PyObject *a[4] = {mem, h, lane, op};
            PyObject *r = PyObject_VectorcallMethod(s_allocate, a, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(op);
            if (r == NULL) {
                if (!PyErr_ExceptionMatches(laneflow_error)) {
                    Py_DECREF(h);
                    goto done;
                }
                PyObject *exc = take_exc();
                for (Py_ssize_t j = 0; j < PyList_GET_SIZE(writes); j++)
                    Py_XSETREF(SLOT(PyList_GET_ITEM(writes, j), b_off[B_ERROR]), Py_NewRef(exc));
                Py_DECREF(exc);
                failed = 1;
            } else {
                Py_DECREF(r);
            }
        }
        Py_DECREF(h);
    }
    if (!failed) {  /* Command.run: the kernel; the outputs' checks set and error cleared, or Command.fail */
        found = PyList_New(0);
        if (found == NULL || PyDict_SetItem(ld, s_checks, found) < 0)
            goto done;
        PyObject *fn = Py_NewRef(SLOT(cmd, c_off[C_FN]));
        args[0] = Py_NewRef(lane);
        args[1] = Py_NewRef(SLOT(cmd, c_off[C_PRIM]));
        args[2] = Py_NewRef(SLOT(cmd, c_off[C_INS]));
        args[3] = Py_NewRef(SLOT(cmd, c_off[C_OUTS]));
        PyObject *r = PyObject_Vectorcall(fn, args, 4, NULL);
        Py_DECREF(fn);
        PyObject *exc = r == NULL ? take_exc() : NULL;
        Py_XDECREF(r);
        if (PyDict_SetItem(ld, s_checks, Py_None) < 0) {
            Py_XDECREF(exc);
            goto done;
        }
        if (PyList_GET_SIZE(found)) {  /* bound also after a failure (a kernel may have been launched) */
            PyObject *a[4] = {cmd, lane, found, exc == NULL ? Py_True : Py_False};
            checks = PyObject_VectorcallMethod(s_bind_found, a, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (checks == NULL) {  /* (raised as Command.run's finally would: the kernel's error its context) */
                if (exc != NULL) {
                    PyObject *e = take_exc();
                    PyException_SetContext(e, exc);  /* (steals exc) */
                    raise_exc(e);
                }
                goto done;
            }
        }
        if (exc != NULL) {
            if (!PyErr_GivenExceptionMatches(exc, PyExc_Exception)) {
                raise_exc(exc);  /* (KeyboardInterrupt and the like: raised, as there) */
                goto done;
            }
            PyObject *fa[3] = {cmd, exc, lane};
            PyObject *f = PyObject_VectorcallMethod(s_fail, fa, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(exc);
            if (f == NULL)
                goto done;
            Py_DECREF(f);
        } else {
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(writes); k++) {
                PyObject *b = Py_NewRef(PyList_GET_ITEM(writes, k));  /* (held: a replaced value's finalizer) */
                Py_XSETREF(SLOT(b, b_off[B_CHECKS]), Py_NewRef(checks == NULL ? Py_None : checks));
                if (SLOT(b, b_off[B_ERROR]) != Py_None)
                    Py_SETREF(SLOT(b, b_off[B_ERROR]), Py_NewRef(Py_None));
                Py_DECREF(b);
            }
        }
    }
    /* EventFence.mark(seq): _last = seq; an event when seq - _marked >= MARK_EVERY */
    PyObject *seq = SLOT(cmd, c_off[C_SEQ]);
    Py_SETREF(SLOT(fence, f_off[F_LAST]), Py_NewRef(seq));
    long long s = PyLong_AsLongLong(seq), m = PyLong_AsLongLong(SLOT(fence, f_off[F_MARKED]));
    if ((s == -1 || m == -1) && PyErr_Occurred())
        goto done;
    if (s - m >= mark_every) {
        PyObject *a[1] = {fence};
        PyObject *r = PyObject_VectorcallMethod(s_record_now, a, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    res = 1;
done:
    for (int k = 0; k < 7; k++)
        Py_DECREF(hold[k]);
    for (int k = 0; k < 4; k++)
        Py_XDECREF(args[k]);
    Py_XDECREF(writes);
    Py_XDECREF(found);
    Py_XDECREF(checks);
    return res;
}

static PyObject *enqueue(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (entry_checks(cmd_t != NULL, "cenqueue", n, 2, "enqueue(lane, cmd)"))
        return NULL;
    int r = enqueue_(a[0], a[1]);
    if (r < 0)
        return NULL;
    return Py_NewRef(r ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS,
     "init(Command, Buffer, DeviceArray, SlabArray, EventFence, _tls, delays, tracing, lanes, LaneflowError)"},
    {"enqueue", (PyCFunction)(void (*)(void))enqueue, METH_FASTCALL,
     "enqueue(lane, cmd) -> True (enqueued) or False (CudaLane._enqueue must)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_laneflow_cenqueue", NULL, -1, methods};

PyMODINIT_FUNC PyInit__laneflow_cenqueue(void) { return PyModule_Create(&module); }
