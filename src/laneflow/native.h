/* What laneflow's C extensions share (native.py builds each with this header beside it, and keys its
   cache entry by both): reading and writing Python objects' __slots__ by offset, and a plain instance
   attribute from the instance's dict.

   Why by offset: PyObject_GetAttr costs 20-40 ns (a type lookup, a descriptor call), more than CPython's
   specialised bytecode reading a slot, so a C path that reads its objects through it is no faster
   than the Python it replaces. The offsets are read once from the types' member descriptors. */
#ifndef LANEFLOW_NATIVE_H
#define LANEFLOW_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The offset of t's own writable object slot name into *off; -1 with TypeError when it has none. */
static inline int offset_of(PyTypeObject *t, const char *name, Py_ssize_t *off) {
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

/* offset_of for n names, into out[0..n) */
static inline int offsets_of(PyTypeObject *t, const char *const *names, int n, Py_ssize_t *out) {
    for (int k = 0; k < n; k++)
        if (offset_of(t, names[k], &out[k]) < 0)
            return -1;
    return 0;
}

/* Types whose instances' attributes `names` are plain: no class attribute that is a data descriptor (a
   property, a slot) shadows the instance dict, so obj.name is obj.__dict__["name"]. */
typedef struct {
    const char *const *names;
    int nnames, n;
    PyTypeObject *types[8]; /* checked so far (referenced), each while its version tag holds */
    unsigned int tags[8];
} Plain;

/* o's instance dict (borrowed; the object keeps it) when o's type is plain for g, else NULL (no error
   set: the caller takes the general path). */
static inline PyObject *plain_dict(PyObject *o, Plain *g) {
    PyTypeObject *t = Py_TYPE(o);
    int known = 0, at = -1;
    for (int i = 0; i < g->n && at < 0; i++)
        if (g->types[i] == t) {
            at = i;  /* (a class attribute assigned since changes the type's version tag: checked again) */
            known = t->tp_version_tag != 0 && g->tags[i] == t->tp_version_tag;
        }
    if (!known) {
        for (int k = 0; k < g->nnames; k++) {
            PyObject *name = PyUnicode_InternFromString(g->names[k]);
            if (name == NULL) {
                PyErr_Clear();
                return NULL;
            }
            PyObject *d = _PyType_Lookup(t, name); /* borrowed; no error set */
            Py_DECREF(name);
            if (d != NULL && Py_TYPE(d)->tp_descr_set != NULL)
                return NULL;
        }
        if (at < 0 && g->n < 8) {
            at = g->n++;
            g->types[at] = (PyTypeObject *)Py_NewRef(t);
        }
        if (at >= 0)
            g->tags[at] = t->tp_version_tag;  /* (set by the lookups above; 0: checked again next time) */
    }
    PyObject *dict = PyObject_GenericGetDict(o, NULL);
    if (dict == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(dict);
    return dict;
}

/* An entry point's checks: its module's init ran (ready) and it got `want` arguments; 0, or -1 with the
   error set (usage: the call's signature, for the message) */
static inline int entry_checks(int ready, const char *module, Py_ssize_t n, Py_ssize_t want, const char *usage) {
    if (!ready) {
        PyErr_Format(PyExc_RuntimeError, "%s: init was not called", module);
        return -1;
    }
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", usage, want, n);
        return -1;
    }
    return 0;
}

/* d[name] (borrowed), or NULL: missing (no error) or an error (set) */
#define DGET(d, name) PyDict_GetItemWithError((d), (name))

#endif
