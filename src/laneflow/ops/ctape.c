/* The tape's node maker (ops/ctape.py loads it; ops/tape_steps.py calls it from the compiled steps).

   A replayed op call makes its recorded nodes anew on the call's arrays: an ArrayData with its ten
   fields, its inputs' user counts raised by one, appended to the replay's list of made nodes, and
   usually an Array bound to it. Written out in Python that is about fifteen attribute stores a call;
   here it is one call. The objects are made as object.__new__ makes them (the type's tp_alloc) and
   their __slots__ are filled through the slots' offsets, read once from the types' member
   descriptors (init), so the objects are exactly those the Python path makes.

   node(made, spec, prim, *inputs) -> the node     spec: (shape, dtype, stream, device, arrays)
   array(made, spec, prim, *inputs) -> an Array bound to the node (the node's arrays count is spec's)
   same_counts(made, users, held) -> whether the made nodes' counts are the recorded ones */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyTypeObject *node_type, *array_type;
/* offsets of ArrayData's slots, in NODE_SLOTS' order, and of Array's _data */
static const char *NODE_SLOTS[] = {"shape", "dtype", "stream", "device", "prim", "inputs", "siblings",
                                   "buffer", "users", "arrays"};
enum { SHAPE, DTYPE, STREAM, DEVICE, PRIM, INPUTS, SIBLINGS, BUFFER, USERS, ARRAYS, NSLOTS };
static Py_ssize_t node_off[NSLOTS], data_off;
static PyObject *zero, *one;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static int offset_of(PyTypeObject *t, const char *name, Py_ssize_t *off) {
    /* (a class's own slot: a heap type's dict holds its member descriptors; a built-in type's dict
       may be NULL from 3.12 on) */
    PyObject *d = PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) && t->tp_dict != NULL
                  ? PyDict_GetItemString(t->tp_dict, name) : NULL; /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) || PyDescr_TYPE(d) != t) {
        PyErr_Format(PyExc_TypeError, "%s has no slot %s", t->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
        m->offset + (Py_ssize_t)sizeof(PyObject *) > t->tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", t->tp_name, name);
        return -1;
    }
    *off = m->offset;
    return 0;
}

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
    Py_ssize_t n_in = nargs - 3;
    PyObject *const *in = args + 3;
    for (Py_ssize_t k = 0; k < n_in; k++) {  /* all checked before anything changes */
        if (!PyObject_TypeCheck(in[k], node_type) || SLOT(in[k], node_off[USERS]) == NULL ||
            !PyLong_CheckExact(SLOT(in[k], node_off[USERS]))) {
            PyErr_SetString(PyExc_TypeError, "ctape: an input is not a node with a user count");
            return NULL;
        }
    }
    PyObject *spec = args[1];
    PyObject *inputs = PyTuple_New(n_in);
    if (inputs == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < n_in; k++)  /* (filled before anything else is allocated) */
        PyTuple_SET_ITEM(inputs, k, Py_NewRef(in[k]));
    PyObject *n = node_type->tp_alloc(node_type, 0);
    if (n == NULL) {
        Py_DECREF(inputs);
        return NULL;
    }
    SLOT(n, node_off[SHAPE]) = Py_NewRef(PyTuple_GET_ITEM(spec, 0));
    SLOT(n, node_off[DTYPE]) = Py_NewRef(PyTuple_GET_ITEM(spec, 1));
    SLOT(n, node_off[STREAM]) = Py_NewRef(PyTuple_GET_ITEM(spec, 2));
    SLOT(n, node_off[DEVICE]) = Py_NewRef(PyTuple_GET_ITEM(spec, 3));
    SLOT(n, node_off[PRIM]) = Py_NewRef(args[2]);
    SLOT(n, node_off[INPUTS]) = inputs;
    SLOT(n, node_off[SIBLINGS]) = Py_NewRef(Py_None);
    SLOT(n, node_off[BUFFER]) = Py_NewRef(Py_None);
    SLOT(n, node_off[USERS]) = Py_NewRef(zero);
    SLOT(n, node_off[ARRAYS]) = Py_NewRef(PyTuple_GET_ITEM(spec, 4));
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
    if (PyList_Append(args[0], n) < 0) {
        Py_DECREF(n);
        return NULL;
    }
    return n;
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

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(ArrayData, Array): read the slots' offsets"},
    {"node", (PyCFunction)(void (*)(void))node, METH_FASTCALL, "node(made, spec, prim, *inputs) -> node"},
    {"array", (PyCFunction)(void (*)(void))array, METH_FASTCALL, "array(made, spec, prim, *inputs) -> Array"},
    {"same_counts", (PyCFunction)(void (*)(void))same_counts, METH_FASTCALL,
     "same_counts(made, users, held) -> whether the nodes' user counts and held flags are those recorded"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_laneflow_ctape", NULL, -1, methods};

PyMODINIT_FUNC PyInit__laneflow_ctape(void) { return PyModule_Create(&module); }
