/*
 * mapping._core: the thin CPython layer over libmapping (linked in
 * statically). Handles travel as Python ints; the classes, argument
 * conversion and lifetimes are in mapping/__init__.py. Every call that can
 * block on the device releases the GIL (small copies on the host back end
 * keep it: see hold_gil_below). A failed call raises the
 * exception class registered for its status (mapping.Error subclasses) with
 * mapping_last_error_message().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "mapping.h"

/* write / read take an optional 5th argument: copies smaller than it keep
 * the GIL (the package passes 64 KiB on the host back end without a modelled
 * link, where such a copy is a memcpy shorter than releasing the GIL; 0,
 * everywhere else, releases it for every copy). */
static Py_ssize_t hold_gil_below(PyObject *const *args, Py_ssize_t nargs)
{
    return nargs > 4 ? PyLong_AsSsize_t(args[4]) : 0;
}

static PyObject *error_classes; /* dict: status int -> exception class */
static PyObject *error_base;

static PyObject *raise_status(mapping_status st)
{
    PyObject *cls = NULL;
    if (error_classes) {
        PyObject *key = PyLong_FromLong(st);
        cls = key ? PyDict_GetItemWithError(error_classes, key) : NULL;
        Py_XDECREF(key);
    }
    if (!cls)
        cls = error_base ? error_base : PyExc_RuntimeError;
    const char *msg = mapping_last_error_message();
    PyObject *args = Py_BuildValue("(s,i)", msg && *msg ? msg : mapping_status_string(st), (int)st);
    if (args) {
        PyErr_SetObject(cls, args);
        Py_DECREF(args);
    }
    return NULL;
}

#define CHECK_ST(expr)              \
    do {                            \
        mapping_status st_ = (expr); \
        if (st_ != MAPPING_OK)      \
            return raise_status(st_); \
    } while (0)

static void *as_ptr(PyObject *o)
{
    if (o == Py_None)
        return NULL;
    return PyLong_AsVoidPtr(o);
}

#define PTR(i) as_ptr(args[i])
#define NEED(n)                                                                              \
    if (nargs != (n)) {                                                                      \
        PyErr_Format(PyExc_TypeError, "expected %d arguments, got %zd", (int)(n), nargs);    \
        return NULL;                                                                         \
    }

static PyObject *from_ptr(const void *p)
{
    return PyLong_FromVoidPtr((void *)p);
}

static int get_size(PyObject *o, size_t *out)
{
    size_t v = PyLong_AsSize_t(o);
    if (v == (size_t)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* ---- errors ---- */

static PyObject *core_set_errors(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *base, *classes;
    if (!PyArg_ParseTuple(args, "OO!", &base, &PyDict_Type, &classes))
        return NULL;
    Py_XSETREF(error_base, Py_NewRef(base));
    Py_XSETREF(error_classes, Py_NewRef(classes));
    Py_RETURN_NONE;
}

static PyObject *core_statuses(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
#define STATUS_ITEM_(name, value, message)                                              \
    {                                                                                   \
        PyObject *t = Py_BuildValue("(sis)", #name, (int)(value), message);             \
        if (!t || PyList_Append(list, t) < 0) {                                         \
            Py_XDECREF(t);                                                              \
            Py_DECREF(list);                                                            \
            return NULL;                                                                \
        }                                                                               \
        Py_DECREF(t);                                                                   \
    }
    MAPPING_STATUS_LIST(STATUS_ITEM_)
#undef STATUS_ITEM_
    return list;
}

/* ---- devices ---- */

/* A C string from a driver as str: UTF-8, any undecodable byte replaced (a
 * device's name is never an error). NULL reads as "". */
static PyObject *text(const char *s)
{
    if (!s)
        s = "";
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

/* d[key] = value, taking value's reference (NULL value: the error is set). */
static int put(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

static PyObject *core_text(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "_text expects bytes");
        return NULL;
    }
    return text(PyBytes_AS_STRING(arg));
}

static PyObject *info_dict(const mapping_device_info *i)
{
    PyObject *caps = PyList_New(0), *d = PyDict_New();
    if (!caps || !d)
        goto fail;
#define CAP_ITEM_(name, bit, label)                                     \
    if (i->caps & MAPPING_CAP_##name) {                                 \
        PyObject *s = PyUnicode_FromString(label);                      \
        if (!s || PyList_Append(caps, s) < 0) {                         \
            Py_XDECREF(s);                                              \
            goto fail;                                                  \
        }                                                               \
        Py_DECREF(s);                                                   \
    }
    MAPPING_CAP_LIST(CAP_ITEM_)
#undef CAP_ITEM_
    if (put(d, "backend", text(i->backend)) < 0 || put(d, "index", PyLong_FromLong(i->index)) < 0 ||
        put(d, "kind", text(i->kind)) < 0 || put(d, "name", text(i->name)) < 0 ||
        put(d, "vendor", text(i->vendor)) < 0 || put(d, "driver", text(i->driver)) < 0 ||
        put(d, "memory_bytes", PyLong_FromUnsignedLongLong((unsigned long long)i->memory_bytes)) < 0)
        goto fail;
    if (put(d, "capabilities", caps) < 0) {
        caps = NULL;
        goto fail;
    }
    return d;
fail:
    Py_XDECREF(caps);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *core_open(PyObject *self, PyObject *args)
{
    (void)self;
    const char *backend = NULL;
    int index = -1;
    unsigned long long budget = 0;
    if (!PyArg_ParseTuple(args, "zi|K", &backend, &index, &budget))
        return NULL;
    mapping_device *dev = NULL;
    mapping_status st;
    Py_BEGIN_ALLOW_THREADS
    if (!backend && index < 0 && !budget)
        st = mapping_open(NULL, &dev);
    else if (!backend && index < 0) /* the environment's back end and device, this budget */
        st = mapping_open(NULL, &dev) == MAPPING_OK ? mapping_device_set_memory_budget(dev, budget) : mapping_last_error();
    else
        st = mapping_open(&(mapping_device_desc){.backend = backend, .device = index < 0 ? 0 : index,
                                                 .memory_budget = budget},
                          &dev);
    Py_END_ALLOW_THREADS
    if (st != MAPPING_OK && dev) {
        mapping_close(dev);
        dev = NULL;
    }
    CHECK_ST(st);
    return from_ptr(dev);
}



static PyObject *core_device_info(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_device_info info;
    CHECK_ST(mapping_device_get_info(as_ptr(arg), &info));
    return info_dict(&info);
}

static PyObject *core_native_device(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_native_device n;
    CHECK_ST(mapping_device_native(as_ptr(arg), &n));
    return Py_BuildValue("(NNNN)", from_ptr(n.context), from_ptr(n.device), from_ptr(n.platform), from_ptr(n.queue));
}

static PyObject *core_list(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    mapping_backend_info b[8];
    int count = 0;
    CHECK_ST(mapping_list_backends(b, 8, &count));
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    for (int i = 0; i < count && i < 8; i++) {
        PyObject *devices = PyList_New(0), *o = PyDict_New();
        if (!devices || !o)
            goto fail_item;
        if (b[i].available && b[i].device_count > 0) {
            /* every device (a fixed array of 16 left out the host back end's
             * 17th to 64th); asked again if the count grew meanwhile */
            int cap = b[i].device_count, n = 0;
            mapping_device_info *d = NULL;
            mapping_status st;
            for (;;) {
                mapping_device_info *more = PyMem_Realloc(d, (size_t)cap * sizeof *d);
                if (!more) {
                    PyMem_Free(d);
                    PyErr_NoMemory();
                    goto fail_item;
                }
                d = more;
                st = mapping_list_devices(b[i].name, d, cap, &n);
                if (st != MAPPING_OK || n <= cap)
                    break;
                cap = n;
            }
            for (int k = 0; st == MAPPING_OK && k < n; k++) {
                PyObject *dev = info_dict(&d[k]);
                if (!dev || PyList_Append(devices, dev) < 0) {
                    Py_XDECREF(dev);
                    PyMem_Free(d);
                    goto fail_item;
                }
                Py_DECREF(dev);
            }
            PyMem_Free(d);
        }
        if (put(o, "name", text(b[i].name)) < 0 || put(o, "compiled", PyBool_FromLong(b[i].compiled)) < 0 ||
            put(o, "available", PyBool_FromLong(b[i].available)) < 0 ||
            put(o, "device_count", PyLong_FromLong(b[i].device_count)) < 0 ||
            put(o, "reason", text(b[i].reason)) < 0)
            goto fail_item;
        if (put(o, "devices", devices) < 0) {
            devices = NULL;
            goto fail_item;
        }
        if (PyList_Append(list, o) < 0) {
            devices = NULL;
            goto fail_item;
        }
        Py_DECREF(o);
        continue;
    fail_item:
        Py_XDECREF(devices);
        Py_XDECREF(o);
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

static PyObject *core_stats(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_stats s;
    CHECK_ST(mapping_device_stats(as_ptr(arg), &s));
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
#define STAT_ITEM_(field)                                                  \
    if (put(d, #field, PyLong_FromUnsignedLongLong(s.field)) < 0) {        \
        Py_DECREF(d);                                                      \
        return NULL;                                                       \
    }
    MAPPING_STATS_LIST(STAT_ITEM_)
#undef STAT_ITEM_
    return d;
}


/* (budget, resident bytes) of a device. */
static PyObject *core_memory_budget(PyObject *self, PyObject *arg)
{
    (void)self;
    uint64_t budget = 0, resident = 0;
    CHECK_ST(mapping_device_memory_budget(as_ptr(arg), &budget, &resident));
    return Py_BuildValue("(KK)", (unsigned long long)budget, (unsigned long long)resident);
}

static PyObject *core_mirror_resident(PyObject *self, PyObject *arg)
{
    (void)self;
    return PyBool_FromLong(mapping_mirror_is_resident(as_ptr(arg)));
}

static PyObject *core_multimirror_resident(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "expected 2 arguments, got %zd", nargs);
        return NULL;
    }
    long j = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(mapping_multimirror_is_resident(as_ptr(args[0]), (int)j));
}

static PyObject *core_device_link(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_link link;
    mapping_device *dev = as_ptr(arg);
    mapping_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mapping_device_link(dev, &link);
    Py_END_ALLOW_THREADS
    CHECK_ST(st);
    return Py_BuildValue("(dd)", link.latency, link.bandwidth);
}

static PyObject *core_device_set_link(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(3);
    mapping_device *dev = PTR(0);
    mapping_link link = {PyFloat_AsDouble(args[1]), PyFloat_AsDouble(args[2])};
    if (PyErr_Occurred())
        return NULL;
    CHECK_ST(mapping_device_set_link(dev, &link));
    Py_RETURN_NONE;
}

/* ---- buffers ---- */





/* A buffer format with Python objects in it ('O', also inside a struct
 * "T{...}"; field names between colons are skipped): its bytes are
 * PyObject pointers, never data to copy (numpy's frombuffer refuses them too). */
static int has_objects(const char *f)
{
    for (int in_name = 0; f && *f; f++) {
        if (*f == ':')
            in_name = !in_name;
        else if (!in_name && *f == 'O')
            return 1;
    }
    return 0;
}

/* Host memory: [stream, buf, offset, obj]. obj is any C-contiguous buffer of
 * plain data; its length is the copy's size; 0 bytes is a no-op. */
static int get_view(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) == 0) {
        if (!has_objects(view->format))
            return 0;
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError,
                     "%s holds Python objects (buffer format '%s', e.g. numpy dtype object): only plain data can be "
                     "copied",
                     what, view->format ? view->format : "O");
        return -1;
    }
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_TypeError) &&
        !PyErr_ExceptionMatches(PyExc_ValueError))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int plain_type = !PyObject_CheckBuffer(obj);
    PyObject *cls = plain_type ? PyExc_TypeError : PyExc_ValueError;
    if (!plain_type && error_classes) {
        PyObject *key = PyLong_FromLong(MAPPING_ERR_INVALID_ARGUMENT);
        PyObject *c = key ? PyDict_GetItemWithError(error_classes, key) : NULL;
        Py_XDECREF(key);
        if (c)
            cls = c;
        else
            PyErr_Clear();
    }
    if (plain_type)
        PyErr_Format(cls, "%s must support the buffer protocol (numpy array, bytes, bytearray, memoryview, "
                          "array.array); got %.100s",
                     what, Py_TYPE(obj)->tp_name);
    else
        PyErr_Format(cls, "%s must be a C-contiguous%s buffer: %S", what, writable ? ", writable" : "",
                     value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
}

/* ---- Pin(obj, writable, what): holds obj's buffer export (PyObject_GetBuffer)
 * until release() or its own end, so the memory cannot move or shrink under
 * queued work: resizing a bytearray or array.array meanwhile raises
 * BufferError, as with a numpy view. .address, .nbytes. ---- */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int       held;
} pin_object;

static PyTypeObject pin_type;

static PyObject *core_pin(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(3);
    int writable = PyObject_IsTrue(args[1]);
    if (writable < 0)
        return NULL;
    const char *what = PyUnicode_Check(args[2]) ? PyUnicode_AsUTF8(args[2]) : "array";
    if (!what)
        return NULL;
    pin_object *p = PyObject_New(pin_object, &pin_type);
    if (!p)
        return NULL;
    p->held = 0;
    if (get_view(args[0], &p->view, writable, what) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    p->held = 1;
    return (PyObject *)p;
}

static void pin_dealloc(pin_object *p)
{
    if (p->held)
        PyBuffer_Release(&p->view);
    p->held = 0;
    PyObject_Free(p);
}

static PyObject *pin_release(pin_object *p, PyObject *unused)
{
    (void)unused;
    if (p->held)
        PyBuffer_Release(&p->view);
    p->held = 0;
    Py_RETURN_NONE;
}

static PyObject *pin_address(pin_object *p, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(p->held ? p->view.buf : NULL);
}

static PyObject *pin_nbytes(pin_object *p, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(p->held ? p->view.len : 0);
}

static PyMethodDef pin_methods[] = {{"release", (PyCFunction)pin_release, METH_NOARGS, "lets the buffer go"},
                                    {NULL, NULL, 0, NULL}};
static PyGetSetDef pin_getset[] = {{"address", (getter)pin_address, NULL, "the first byte", NULL},
                                   {"nbytes", (getter)pin_nbytes, NULL, "the size", NULL},
                                   {NULL, NULL, NULL, NULL, NULL}};
static PyTypeObject pin_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mapping._core.Pin",
    .tp_basicsize = sizeof(pin_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)pin_dealloc,
    .tp_methods = pin_methods,
    .tp_getset = pin_getset,
    .tp_doc = "a held buffer export (mapping._core.pin)",
};

static void *pin_addr(PyObject *o, size_t *n)
{
    if (Py_TYPE(o) != &pin_type || !((pin_object *)o)->held) {
        PyErr_SetString(PyExc_TypeError, "expected a held mapping._core.Pin");
        return NULL;
    }
    *n = (size_t)((pin_object *)o)->view.len;
    return ((pin_object *)o)->view.buf;
}

/* ---- keep records released by completion ----
 * keep_until(stream, obj) holds obj until the stream reaches this point: a
 * host function queued on the stream moves the record to a done list (it
 * takes no GIL and calls no Python, so it is safe on a driver thread); the
 * records on it are dropped, with the GIL, by a pending call on the main
 * thread and at every keep_until / stream sync / drain() call. Dropping a
 * record can free the C objects it holds, so it is never done on the
 * stream's own thread. */
typedef struct done_node {
    struct done_node *next;
    PyObject         *obj;
} done_node;

static PyThread_type_lock done_lock;
static done_node         *done_head;
static int                drain_scheduled;

/* ---- the exit gate: calls into Python from threads Python did not make ----
 * A stream's thread (the host back end's worker, a driver's callback
 * thread) calls Python in two places: keep_done's Py_AddPendingCall and
 * host_call's launch_host function. Once the interpreter finalizes, neither
 * may happen (the interpreter they would touch is being freed: a worker's
 * Py_AddPendingCall after Py_Finalize crashed the exit of a program whose
 * exit handler queued work). So each goes through the gate:
 * py_gate_enter() checks, holding py_gate, that the interpreter is not
 * finalizing, and the caller keeps py_gate until it has done the part that
 * touches the interpreter (the pending call; a new thread state). The gate
 * closes for good when the interpreter starts finalizing (checked at each
 * entry), or when exit_gate()'s capsule is destroyed (the package's module
 * is cleared at finalization, before the interpreter is freed): taking
 * py_gate there waits for an entry that passed the check before
 * finalization began and has not yet finished with the interpreter. Work
 * that reaches the gate after that calls no Python: a launch_host function
 * is not run, and what a record holds is left to the process's end. */
static PyThread_type_lock  py_gate;
static int                 py_gate_closed;
static PyInterpreterState *py_interp; /* the interpreter that imported this module */

static int py_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* 1: Python may be called, py_gate is held (py_gate_leave); 0: it may not. */
static int py_gate_enter(void)
{
    if (!py_gate)
        return 0;
    PyThread_acquire_lock(py_gate, WAIT_LOCK);
    if (!py_gate_closed && !py_finalizing())
        return 1;
    py_gate_closed = 1;
    PyThread_release_lock(py_gate);
    return 0;
}

static void py_gate_leave(void)
{
    PyThread_release_lock(py_gate);
}

static void py_gate_close(PyObject *capsule)
{
    (void)capsule;
    if (!py_gate || !py_finalizing())
        return; /* dropped before finalization (a reload of the package): the gate stays open */
    PyThread_acquire_lock(py_gate, WAIT_LOCK); /* waits for an entry still using the interpreter */
    py_gate_closed = 1;
    PyThread_release_lock(py_gate);
}

/* exit_gate(): a capsule that closes the gate when it is destroyed; the
 * package keeps it in its module globals, which the interpreter clears at
 * finalization. */
static PyObject *core_exit_gate(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    static char tag;
    return PyCapsule_New(&tag, "mapping._core.exit_gate", py_gate_close);
}

static void drain_done(void)
{
    if (!done_lock)
        return;
    PyThread_acquire_lock(done_lock, WAIT_LOCK);
    done_node *n = done_head;
    done_head = NULL;
    drain_scheduled = 0;
    PyThread_release_lock(done_lock);
    while (n) {
        done_node *next = n->next;
        PyObject *o = n->obj;
        PyMem_RawFree(n);
        Py_DECREF(o);
        n = next;
    }
}

static int drain_pending(void *unused)
{
    (void)unused;
    drain_done();
    return 0;
}

static void keep_done(void *user)
{
    done_node *n = user;
    PyThread_acquire_lock(done_lock, WAIT_LOCK);
    n->next = done_head;
    done_head = n;
    int schedule = !drain_scheduled;
    drain_scheduled = 1;
    PyThread_release_lock(done_lock);
    if (!schedule)
        return;
    /* Through the gate: after finalization the record stays on the list,
     * never dropped (the process is ending). */
    int pending = -1;
    if (py_gate_enter()) {
        pending = Py_AddPendingCall(drain_pending, NULL);
        py_gate_leave();
    }
    if (pending < 0) {
        PyThread_acquire_lock(done_lock, WAIT_LOCK);
        drain_scheduled = 0; /* the next keep_until or sync drains it */
        PyThread_release_lock(done_lock);
    }
}

/* Holds obj until stream s reaches this point; 0, or -1 with the error set
 * (*st the status, MAPPING_OK for a Python error). */
static int keep_record(mapping_stream *s, PyObject *obj, mapping_status *st)
{
    *st = MAPPING_OK;
    drain_done();
    done_node *n = PyMem_RawMalloc(sizeof *n);
    if (!n) {
        PyErr_NoMemory();
        return -1;
    }
    n->next = NULL;
    n->obj = Py_NewRef(obj);
    Py_BEGIN_ALLOW_THREADS /* a full queue waits for its thread, which may want the GIL */
    *st = mapping_launch_host(s, keep_done, n);
    Py_END_ALLOW_THREADS
    if (*st != MAPPING_OK) {
        Py_DECREF(n->obj);
        PyMem_RawFree(n);
        raise_status(*st);
        return -1;
    }
    return 0;
}

/* [stream, obj] */
static PyObject *core_keep_until(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    mapping_stream *s = PTR(0);
    if (PyErr_Occurred())
        return NULL;
    mapping_status st;
    if (keep_record(s, args[1], &st) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* queued(stream, keep, always, fn, *args): fn(*args), a _core call that
 * queues work on stream, then the record holding `keep` (what that work
 * uses) until the stream has passed it, in one C call: no Python code runs
 * between them, so a signal handler's exception (Ctrl-C's
 * KeyboardInterrupt) can no longer come after the work was queued and
 * before its record, which let a host buffer be freed or resized under its
 * queued copy. always: the record also when fn failed (a failed batch flush
 * may have queued some of its copies). Without a record (the stream's queue
 * refused it) the stream is waited for, then the error raised. */
static PyObject *core_queued(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 4) {
        PyErr_Format(PyExc_TypeError, "queued expected at least 4 arguments, got %zd", nargs);
        return NULL;
    }
    mapping_stream *s = PTR(0);
    int always = PyObject_IsTrue(args[2]);
    if (always < 0 || PyErr_Occurred())
        return NULL;
    PyObject *r = PyObject_Vectorcall(args[3], args + 4, (size_t)(nargs - 4), NULL);
    if (!r && !always)
        return NULL;
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (!r)
        PyErr_Fetch(&type, &value, &tb);
    mapping_status st;
    if (keep_record(s, args[1], &st) < 0) { /* wait for what was queued: then nothing needs the record */
        Py_BEGIN_ALLOW_THREADS
        st = mapping_stream_synchronize(s);
        Py_END_ALLOW_THREADS
        (void)st;
        drain_done();
        if (r) {
            Py_DECREF(r);
            return NULL;
        }
        PyErr_Clear(); /* fn's error is the one to raise */
    }
    if (!r) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    return r;
}

static PyObject *core_drain(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    drain_done();
    Py_RETURN_NONE;
}

/* In a child after os.fork() (mapping/__init__.py registers it): the done
 * list's lock may have been held by a library thread of the parent, which
 * the child does not have; a new lock, and the records inherited are
 * dropped (work queued in the parent never runs here). */
static long          host_fns_pending; /* launch_host functions queued, not yet run (changed with the GIL) */
static unsigned long fork_generation;  /* os.fork() children this process is (after_fork_child) */
static _Thread_local int in_host_fn;   /* this thread is running a launch_host function */

static PyObject *core_after_fork_child(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyThread_type_lock lock = PyThread_allocate_lock();
    if (!lock)
        return PyErr_NoMemory();
    done_lock = lock; /* the old one is left as it is: it may be held */
    drain_scheduled = 0;
    PyThread_type_lock gate = PyThread_allocate_lock();
    if (gate)
        py_gate = gate; /* the same for the gate (a stream thread of the parent may have held it) */
    host_fns_pending = 0; /* the parent's queued functions never run here */
    fork_generation++;    /* family locks held by the parent's other threads are renewed (fl_after_fork) */
    drain_done();
    Py_RETURN_NONE;
}

/* launch_host(stream, fn): fn() runs in stream order on the library's thread
 * (with the GIL); fn is dropped through the done list. An exception in fn is
 * the caller's wrapper's to catch (mapping.launch_host stores it). */
static void host_call(void *user)
{
    done_node *n = user;
    /* Through the gate (see py_gate): once the interpreter finalizes, fn is
     * not run and n is left to the process's end. The thread state is made
     * inside the gate (it touches the interpreter); taking the GIL after
     * finalization began ends this thread (CPython's rule), which is safe. */
    if (!py_gate_enter())
        return;
    PyThreadState *ts = NULL;
    PyGILState_STATE g = PyGILState_UNLOCKED;
    int own = PyGILState_GetThisThreadState() == NULL; /* a thread Python does not know (a stream's) */
    if (own && !(ts = PyThreadState_New(py_interp))) {
        py_gate_leave();
        return;
    }
    py_gate_leave();
    if (own)
        PyEval_AcquireThread(ts);
    else
        g = PyGILState_Ensure();
    int was = in_host_fn;
    in_host_fn = 1; /* what fn lets go of is destroyed later, elsewhere (mapping._Handle.release) */
    PyObject *r = PyObject_CallNoArgs(n->obj);
    if (!r)
        PyErr_WriteUnraisable(n->obj);
    Py_XDECREF(r);
    in_host_fn = was;
    host_fns_pending--;
    if (own) {
        PyThreadState_Clear(ts);
        PyThreadState_DeleteCurrent(); /* and gives the GIL back */
    } else {
        PyGILState_Release(g);
    }
    keep_done(n);
}

static PyObject *core_launch_host(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    mapping_stream *s = PTR(0);
    if (PyErr_Occurred())
        return NULL;
    if (!PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "launch_host: fn must be callable");
        return NULL;
    }
    done_node *n = PyMem_RawMalloc(sizeof *n);
    if (!n)
        return PyErr_NoMemory();
    n->next = NULL;
    n->obj = Py_NewRef(args[1]);
    mapping_status st;
    host_fns_pending++; /* before: the stream may run it before mapping_launch_host returns */
    Py_BEGIN_ALLOW_THREADS
    st = mapping_launch_host(s, host_call, n);
    Py_END_ALLOW_THREADS
    if (st != MAPPING_OK) {
        host_fns_pending--;
        Py_DECREF(n->obj);
        PyMem_RawFree(n);
        return raise_status(st);
    }
    drain_done();
    Py_RETURN_NONE;
}

/* How many launch_host functions are queued and have not run yet: at
 * interpreter exit such a function can no longer take the GIL (its thread
 * exits or blocks for good), so nothing may wait for its stream then
 * (mapping._Handle.release, mapping._finish_host_functions_at_exit). */
static PyObject *core_host_fns_pending(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(host_fns_pending);
}

/* True on a thread running a launch_host function (the library's stream
 * thread, or a driver's): a C object let go of there is destroyed later on
 * another thread (defer), as destroying a stream, a device or a pipeline
 * from a function on its own stream is refused by the library (it would
 * wait for itself) and on CUDA a host function must not call the driver. */
static PyObject *core_in_host_fn(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyBool_FromLong(in_host_fn);
}

/* defer(obj): drops obj later, with the GIL, through the done list (a
 * pending call on the main thread, or the next keep_until / stream sync /
 * drain()): mapping._Handle.release hands over what a launch_host function
 * let go of. */
static PyObject *core_defer(PyObject *self, PyObject *obj)
{
    (void)self;
    done_node *n = PyMem_RawMalloc(sizeof *n);
    if (!n)
        return PyErr_NoMemory();
    n->next = NULL;
    n->obj = Py_NewRef(obj);
    keep_done(n);
    Py_RETURN_NONE;
}

static PyObject *core_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4 && nargs != 5) {
        PyErr_Format(PyExc_TypeError, "expected 4 or 5 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t hold = hold_gil_below(args, nargs);
    mapping_stream *s = PTR(0);
    mapping_buffer *b = PTR(1);
    size_t offset;
    if (PyErr_Occurred() || get_size(args[2], &offset) < 0)
        return NULL;
    Py_buffer view;
    if (get_view(args[3], &view, 0, "cpu_data") < 0)
        return NULL;
    mapping_status st = MAPPING_OK;
    if (view.len > 0) {
        if (view.len >= hold) {
            Py_BEGIN_ALLOW_THREADS
            st = mapping_sync_to_gpu_range(s, view.buf, b, offset, (size_t)view.len);
            Py_END_ALLOW_THREADS
        } else {
            st = mapping_sync_to_gpu_range(s, view.buf, b, offset, (size_t)view.len);
        }
    }
    PyBuffer_Release(&view);
    CHECK_ST(st);
    Py_RETURN_NONE;
}

static PyObject *core_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4 && nargs != 5) {
        PyErr_Format(PyExc_TypeError, "expected 4 or 5 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t hold = hold_gil_below(args, nargs);
    mapping_stream *s = PTR(0);
    mapping_buffer *b = PTR(1);
    size_t offset;
    if (PyErr_Occurred() || get_size(args[2], &offset) < 0)
        return NULL;
    Py_buffer view;
    if (get_view(args[3], &view, 1, "cpu_result") < 0)
        return NULL;
    mapping_status st = MAPPING_OK;
    if (view.len > 0) {
        if (view.len >= hold) {
            Py_BEGIN_ALLOW_THREADS
            st = mapping_sync_to_cpu_range(s, b, offset, view.buf, (size_t)view.len);
            Py_END_ALLOW_THREADS
        } else {
            st = mapping_sync_to_cpu_range(s, b, offset, view.buf, (size_t)view.len);
        }
    }
    PyBuffer_Release(&view);
    CHECK_ST(st);
    Py_RETURN_NONE;
}






/* ---- host memory as a Python buffer: HostMemory(address, nbytes, owner, readonly) ----
 * exposes raw memory to numpy (np.frombuffer) and keeps `owner` alive as long
 * as any view of it exists. */
typedef struct {
    PyObject_HEAD
    void      *addr;
    Py_ssize_t nbytes;
    PyObject  *owner;
    int        readonly;
    Py_ssize_t exports;
} host_memory;

static int host_memory_init(host_memory *self, PyObject *args, PyObject *kw)
{
    (void)kw;
    PyObject *addr, *owner;
    Py_ssize_t n;
    int readonly = 0;
    if (!PyArg_ParseTuple(args, "OnO|p", &addr, &n, &owner, &readonly))
        return -1;
    /* Once only: a second __init__ (reachable from any array of it as
     * a.base.base.obj) would drop the owner, freeing the memory under the
     * views already made. */
    if (self->owner) {
        PyErr_SetString(PyExc_TypeError, "HostMemory is initialized once");
        return -1;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "HostMemory: nbytes must be >= 0");
        return -1;
    }
    self->addr = PyLong_AsVoidPtr(addr);
    if (PyErr_Occurred())
        return -1;
    self->nbytes = n;
    Py_XSETREF(self->owner, Py_NewRef(owner));
    self->readonly = readonly;
    return 0;
}

static void host_memory_dealloc(host_memory *self)
{
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int host_memory_getbuffer(host_memory *self, Py_buffer *view, int flags)
{
    static char empty;
    int st = PyBuffer_FillInfo(view, (PyObject *)self, self->nbytes ? self->addr : &empty, self->nbytes,
                               self->readonly, flags);
    if (st == 0)
        self->exports++;
    return st;
}

static void host_memory_releasebuffer(host_memory *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs host_memory_as_buffer = {(getbufferproc)host_memory_getbuffer,
                                              (releasebufferproc)host_memory_releasebuffer};

static PyObject *host_memory_address(host_memory *self, void *closure)
{
    (void)closure;
    return from_ptr(self->addr);
}

static PyGetSetDef host_memory_getset[] = {{"address", (getter)host_memory_address, NULL, "the first byte", NULL},
                                           {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject host_memory_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mapping._core.HostMemory",
    .tp_basicsize = sizeof(host_memory),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)host_memory_init,
    .tp_dealloc = (destructor)host_memory_dealloc,
    .tp_as_buffer = &host_memory_as_buffer,
    .tp_getset = host_memory_getset,
    .tp_doc = "HostMemory(address, nbytes, owner, readonly=False): raw memory as a buffer; keeps owner alive",
};

/* The address of a C-contiguous buffer (writable if asked), and its size. */
static PyObject *core_address_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    int writable = PyObject_IsTrue(args[1]);
    Py_buffer view;
    if (get_view(args[0], &view, writable, "array") < 0)
        return NULL;
    PyObject *r = Py_BuildValue("(Nn)", from_ptr(view.buf), view.len);
    PyBuffer_Release(&view);
    return r;
}

/* ---- streams and events ---- */




static PyObject *core_stream_sync(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_stream *s = as_ptr(arg);
    mapping_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mapping_stream_synchronize(s);
    Py_END_ALLOW_THREADS
    drain_done();
    CHECK_ST(st);
    Py_RETURN_NONE;
}





static PyObject *core_event_query(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_status st = mapping_event_query(as_ptr(arg));
    if (st == MAPPING_OK)
        Py_RETURN_TRUE;
    if (st == MAPPING_ERR_NOT_READY)
        Py_RETURN_FALSE;
    return raise_status(st);
}

static PyObject *core_event_elapsed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    double s = 0;
    CHECK_ST(mapping_event_elapsed(PTR(0), PTR(1), &s));
    return PyFloat_FromDouble(s);
}


/* ---- mirrors ---- */


/* [dev, pin, flags]: the caller keeps the Pin until the mirror is destroyed. */
static PyObject *core_mirror_wrap(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(3);
    size_t n = 0;
    mapping_device *dev = PTR(0);
    if (PyErr_Occurred())
        return NULL;
    void *cpu = pin_addr(args[1], &n);
    unsigned flags = (unsigned)PyLong_AsUnsignedLong(args[2]);
    if (!cpu || PyErr_Occurred())
        return NULL;
    mapping_mirror *m = NULL;
    CHECK_ST(mapping_mirror_wrap(dev, cpu, n, flags, &m));
    return from_ptr(m);
}

/* [dev, pin, buf, gpu_offset, flags] */
static PyObject *core_mirror_adopt(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(5);
    size_t off, n = 0;
    mapping_device *dev = PTR(0);
    mapping_buffer *b = PTR(2);
    if (PyErr_Occurred())
        return NULL;
    void *cpu = pin_addr(args[1], &n);
    unsigned flags = (unsigned)PyLong_AsUnsignedLong(args[4]);
    if (!cpu || PyErr_Occurred() || get_size(args[3], &off) < 0)
        return NULL;
    mapping_mirror *m = NULL;
    CHECK_ST(mapping_mirror_adopt(dev, cpu, b, off, n, flags, &m));
    return from_ptr(m);
}



static PyObject *core_mirror_parts(PyObject *self, PyObject *arg)
{
    (void)self;
    mapping_mirror *m = as_ptr(arg);
    return Py_BuildValue("(NnNnO)", from_ptr(mapping_mirror_cpu(m)), (Py_ssize_t)mapping_mirror_size(m),
                         from_ptr(mapping_mirror_gpu(m)), (Py_ssize_t)mapping_mirror_gpu_offset(m),
                         mapping_mirror_is_unified(m) ? Py_True : Py_False);
}



/* (mirror, side) arguments of the mirror queries below. */
static int mirror_side_args(PyObject *const *args, Py_ssize_t nargs, mapping_mirror **m, mapping_side *side)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "expected 2 arguments, got %zd", nargs);
        return -1;
    }
    *m = as_ptr(args[0]);
    long s = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return -1;
    *side = (mapping_side)s;
    return 0;
}

static PyObject *core_mirror_stale(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    mapping_mirror *m;
    mapping_side side;
    if (mirror_side_args(args, nargs, &m, &side))
        return NULL;
    mapping_clear_last_error();
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = mapping_mirror_stale_bytes(m, side);
    Py_END_ALLOW_THREADS
    if (mapping_last_error() != MAPPING_OK)
        return raise_status(mapping_last_error());
    return PyLong_FromSize_t(n);
}

/* mapping_mirror_needs_sync: never waits, so no GIL release. */
static PyObject *core_mirror_needs_sync(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    mapping_mirror *m;
    mapping_side side;
    if (mirror_side_args(args, nargs, &m, &side))
        return NULL;
    int out = 0;
    CHECK_ST(mapping_mirror_needs_sync(m, side, &out));
    return PyBool_FromLong(out);
}




/* [list of device handles, pin, granule, flags] -> [mirror handles]; the caller keeps the Pin. */
static PyObject *core_mirror_sharded(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(4);
    size_t n = 0, granule;
    if (!PyList_Check(args[0]) || PyList_GET_SIZE(args[0]) < 1 || PyList_GET_SIZE(args[0]) > 1024) {
        PyErr_SetString(PyExc_ValueError, "mirror_sharded: 1 to 1024 devices");
        return NULL;
    }
    void *cpu = pin_addr(args[1], &n);
    unsigned flags = (unsigned)PyLong_AsUnsignedLong(args[3]);
    if (!cpu || PyErr_Occurred() || get_size(args[2], &granule) < 0)
        return NULL;
    int count = (int)PyList_GET_SIZE(args[0]);
    mapping_device **devs = PyMem_Calloc((size_t)count, sizeof *devs);
    mapping_mirror **shards = PyMem_Calloc((size_t)count, sizeof *shards);
    PyObject *out = NULL;
    if (!devs || !shards) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < count; i++) {
        devs[i] = as_ptr(PyList_GET_ITEM(args[0], i));
        if (PyErr_Occurred())
            goto done;
    }
    mapping_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mapping_mirror_create_sharded(devs, count, cpu, n, granule, flags, shards);
    Py_END_ALLOW_THREADS
    if (st != MAPPING_OK) {
        raise_status(st);
        goto done;
    }
    out = PyList_New(count);
    for (int i = 0; out && i < count; i++) {
        PyObject *p = from_ptr(shards[i]);
        if (!p) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, p);
    }
    if (!out) /* none is left on failure */
        for (int i = 0; i < count; i++)
            mapping_mirror_destroy(shards[i]);
done:
    PyMem_Free(devs);
    PyMem_Free(shards);
    return out;
}

/* ---- multimirrors: one host array, a replica per device; side -1 is the CPU ---- */

/* [list of device handles, nbytes] */
static PyObject *core_multimirror_create(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    size_t n;
    if (!PyList_Check(args[0]) || PyList_GET_SIZE(args[0]) < 1 ||
        PyList_GET_SIZE(args[0]) > MAPPING_MULTIMIRROR_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "multimirror: 1 to %d devices", (int)MAPPING_MULTIMIRROR_MAX_DEVICES);
        return NULL;
    }
    if (get_size(args[1], &n) < 0)
        return NULL;
    mapping_device *devs[MAPPING_MULTIMIRROR_MAX_DEVICES];
    int count = (int)PyList_GET_SIZE(args[0]);
    for (int i = 0; i < count; i++) {
        devs[i] = as_ptr(PyList_GET_ITEM(args[0], i));
        if (PyErr_Occurred())
            return NULL;
    }
    mapping_multimirror *m = NULL;
    mapping_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mapping_multimirror_create(devs, count, n, &m);
    Py_END_ALLOW_THREADS
    CHECK_ST(st);
    return from_ptr(m);
}


/* [m, count] -> (cpu address, size, [replica buffer handles]) */
static PyObject *core_multimirror_parts(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    mapping_multimirror *m = PTR(0);
    long count = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *gpus = PyList_New(0);
    if (!gpus)
        return NULL;
    for (long i = 0; i < count && i < MAPPING_MULTIMIRROR_MAX_DEVICES; i++) {
        PyObject *b = from_ptr(mapping_multimirror_gpu(m, (int)i));
        if (!b || PyList_Append(gpus, b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(gpus);
            return NULL;
        }
        Py_DECREF(b);
    }
    return Py_BuildValue("(NnN)", from_ptr(mapping_multimirror_cpu(m)), (Py_ssize_t)mapping_multimirror_size(m),
                         gpus);
}



/* [m, side] */
static PyObject *core_multimirror_stale(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(2);
    mapping_multimirror *m = PTR(0);
    long side = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    mapping_clear_last_error();
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = mapping_multimirror_stale_bytes(m, (int)side);
    Py_END_ALLOW_THREADS
    if (mapping_last_error() != MAPPING_OK)
        return raise_status(mapping_last_error());
    return PyLong_FromSize_t(n);
}

/* ---- batches ---- */



/* [batch, to_gpu, buf, offset, pin]: the caller keeps the Pin until the flush is done. */
static PyObject *core_batch_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(5);
    size_t off, n = 0;
    mapping_batch *b = PTR(0);
    int to_gpu = PyObject_IsTrue(args[1]);
    mapping_buffer *buf = PTR(2);
    if (to_gpu < 0 || PyErr_Occurred() || get_size(args[3], &off) < 0)
        return NULL;
    void *host = pin_addr(args[4], &n);
    if (!host)
        return NULL;
    CHECK_ST(to_gpu ? mapping_batch_add_to_gpu(b, host, buf, off, n) : mapping_batch_add_to_cpu(b, buf, off, host, n));
    Py_RETURN_NONE;
}


static PyObject *core_batch_count(PyObject *self, PyObject *arg)
{
    (void)self;
    return PyLong_FromSize_t(mapping_batch_count(as_ptr(arg)));
}


/* ---- pipelines ---- */

static PyObject *core_pipeline_create(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(4);
    size_t chunk, elem;
    mapping_device *dev = PTR(0);
    long depth = PyLong_AsLong(args[2]);
    if (PyErr_Occurred() || get_size(args[1], &chunk) < 0 || get_size(args[3], &elem) < 0)
        return NULL;
    if (depth < 0 || depth > 1024) {
        PyErr_Format(PyExc_ValueError, "pipeline: depth=%ld is outside 0..1024", depth);
        return NULL;
    }
    mapping_pipeline *p = NULL;
    mapping_pipeline_desc desc = {chunk, (int)depth, elem};
    CHECK_ST(mapping_pipeline_create(dev, &desc, &p));
    mapping_pipeline_desc got;
    CHECK_ST(mapping_pipeline_get_desc(p, &got));
    return Py_BuildValue("(Nnin)", from_ptr(p), (Py_ssize_t)got.chunk_bytes, got.depth, (Py_ssize_t)got.element_bytes);
}


typedef struct {
    PyObject *step;
} pipeline_call;

/* Runs on the thread that called run (with the GIL released around the run). */
static mapping_status pipeline_step(mapping_stream *stream, const mapping_pipeline_chunk *c, void *user)
{
    pipeline_call *call = user;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(call->step, "NNnnnNnNn", from_ptr(stream), PyLong_FromSize_t(c->index),
                                        (Py_ssize_t)c->offset, (Py_ssize_t)c->bytes, (Py_ssize_t)0,
                                        from_ptr(c->input), (Py_ssize_t)c->input_offset, from_ptr(c->output),
                                        (Py_ssize_t)c->output_offset);
    mapping_status st = MAPPING_OK;
    if (!r)
        st = MAPPING_ERR_INVALID_ARGUMENT; /* the Python exception stays set and is raised by run */
    Py_XDECREF(r);
    PyGILState_Release(g);
    return st;
}

/* [pipeline, src, dst or None, step] */
static PyObject *core_pipeline_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(4);
    mapping_pipeline *p = PTR(0);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer src, dst;
    if (get_view(args[1], &src, 0, "src") < 0)
        return NULL;
    int has_dst = args[2] != Py_None;
    if (has_dst && get_view(args[2], &dst, 1, "dst") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (has_dst && dst.len != src.len) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_Format(PyExc_ValueError, "dst has %zd bytes, src %zd: they must be the same size", dst.len, src.len);
        return NULL;
    }
    /* A dst that overlaps src other than exactly (in place) is refused by
     * mapping_pipeline_run itself (INVALID_ARGUMENT, raised below). */
    pipeline_call call = {args[3]};
    mapping_status st = MAPPING_OK;
    if (src.len > 0) {
        Py_BEGIN_ALLOW_THREADS
        st = mapping_pipeline_run(p, src.buf, has_dst ? dst.buf : NULL, (size_t)src.len, pipeline_step, &call);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    if (has_dst)
        PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    CHECK_ST(st);
    Py_RETURN_NONE;
}

/* ---- DLPack ---- */

typedef struct {
    int32_t device_type;
    int32_t device_id;
} dl_device;

typedef struct {
    uint8_t  code;
    uint8_t  bits;
    uint16_t lanes;
} dl_dtype;

typedef struct {
    void     *data;
    dl_device device;
    int32_t   ndim;
    dl_dtype  dtype;
    int64_t  *shape;
    int64_t  *strides;
    uint64_t  byte_offset;
} dl_tensor;

typedef struct dl_managed {
    dl_tensor dl_tensor;
    void     *manager_ctx;
    void    (*deleter)(struct dl_managed *self);
} dl_managed;

/* DLPack >= 1.0: the versioned tensor, with flags (bit 0: read-only). */
typedef struct {
    uint32_t major, minor;
} dl_version;

typedef struct dl_managed_v {
    dl_version version;
    void      *manager_ctx;
    void     (*deleter)(struct dl_managed_v *self);
    uint64_t   flags;
    dl_tensor  dl_tensor;
} dl_managed_v;

/* An export holds `owner` (the buffer's handle) until the consumer's deleter
 * runs, so the memory outlives close() of the buffer and of its device. */
typedef struct {
    dl_managed   managed;
    dl_managed_v managed_v;
    PyObject    *owner;
    int64_t      shape[32];
} dl_export;

static void dl_export_free(dl_export *e)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(e->owner);
    PyGILState_Release(g);
    PyMem_RawFree(e);
}

static void dl_export_deleter(dl_managed *m)
{
    dl_export_free((dl_export *)((char *)m - offsetof(dl_export, managed)));
}

static void dl_export_deleter_v(dl_managed_v *m)
{
    dl_export_free((dl_export *)((char *)m - offsetof(dl_export, managed_v)));
}

static void dl_capsule_destructor(PyObject *capsule)
{
    if (PyCapsule_IsValid(capsule, "dltensor")) { /* never consumed */
        dl_managed *m = PyCapsule_GetPointer(capsule, "dltensor");
        if (m && m->deleter)
            m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        dl_managed_v *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (m && m->deleter)
            m->deleter(m);
    }
}

/* to_dlpack(address, device_type, device_id, shape tuple, (code, bits), owner, versioned, buffer):
 * versioned (the consumer asked for max_version >= 1.0): a writable
 * "dltensor_versioned"; else the legacy "dltensor". buffer: the C buffer
 * the address is in (None: an empty one); the shape must fit in it
 * (mapping_buffer_size), whatever the Python object's shape, dtype and
 * nbytes attributes were set to: a consumer reads and writes all of it. */
static PyObject *core_to_dlpack(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *addr, *shape, *owner, *buffer = Py_None;
    int dtype, did, code, bits, versioned = 0;
    if (!PyArg_ParseTuple(args, "OiiO!(ii)O|pO", &addr, &dtype, &did, &PyTuple_Type, &shape, &code, &bits, &owner,
                          &versioned, &buffer))
        return NULL;
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > 32) {
        PyErr_SetString(PyExc_ValueError, "at most 32 dimensions");
        return NULL;
    }
    if (bits <= 0 || bits > 255 || code < 0 || code > 255) {
        PyErr_SetString(PyExc_ValueError, "to_dlpack: bad dtype");
        return NULL;
    }
    size_t room = 0;
    if (buffer != Py_None) {
        mapping_buffer *b = as_ptr(buffer);
        if (PyErr_Occurred())
            return NULL;
        mapping_clear_last_error();
        room = mapping_buffer_size(b);
        if (mapping_last_error() != MAPPING_OK)
            return raise_status(mapping_last_error());
    }
    dl_export *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    size_t need = (size_t)bits / 8;
    int too_big = 0;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        e->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (e->shape[i] < 0 || (need && (uint64_t)e->shape[i] > SIZE_MAX / need))
            too_big = 1;
        else
            need *= (size_t)e->shape[i];
    }
    void *data = PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(addr);
    if (!PyErr_Occurred() && (too_big || need > room || bits % 8))
        PyErr_Format(PyExc_BufferError, "__dlpack__: shape %S of %d-bit items does not fit in the buffer's %zu bytes",
                     shape, bits, room);
    if (PyErr_Occurred()) {
        PyMem_RawFree(e);
        return NULL;
    }
    dl_tensor t = {data, {dtype, did}, (int32_t)ndim, {(uint8_t)code, (uint8_t)bits, 1}, e->shape, NULL, 0};
    e->owner = Py_NewRef(owner);
    PyObject *cap;
    if (versioned) {
        e->managed_v.version = (dl_version){1, 0};
        e->managed_v.dl_tensor = t;
        e->managed_v.deleter = dl_export_deleter_v;
        e->managed_v.flags = 0; /* writable, not a copy */
        cap = PyCapsule_New(&e->managed_v, "dltensor_versioned", dl_capsule_destructor);
    } else {
        e->managed.dl_tensor = t; /* strides NULL: compact, row-major */
        e->managed.deleter = dl_export_deleter;
        cap = PyCapsule_New(&e->managed, "dltensor", dl_capsule_destructor);
    }
    if (!cap) {
        Py_DECREF(e->owner);
        PyMem_RawFree(e);
    }
    return cap;
}

static void dl_import_release(void *user)
{
    dl_managed *m = user;
    if (m->deleter) {
        PyGILState_STATE g = PyGILState_Ensure();
        m->deleter(m);
        PyGILState_Release(g);
    }
}

/* import_dlpack(dev, capsule, device_type, device_id) -> (buffer, device_type, device_id, shape,
 * (code, bits), nbytes): consumes the capsule, whose tensor must be on DLPack
 * device (device_type, device_id) (device_id -1: any), the one the caller
 * chose `dev` for: __dlpack_device__ is only the producer's word, and a
 * cl_mem or CUDA pointer taken as host memory was read and written as such;
 * the buffer's release calls the producer's deleter. */
static PyObject *core_import_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(4);
    mapping_device *dev = PTR(0);
    long want_type = PyLong_AsLong(args[2]), want_id = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    dl_managed *m = PyCapsule_GetPointer(args[1], "dltensor");
    if (!m)
        return NULL;
    dl_tensor *t = &m->dl_tensor;
    if (t->device.device_type != want_type || (want_id >= 0 && t->device.device_id != want_id)) {
        PyObject *key = PyLong_FromLong(MAPPING_ERR_DEVICE_MISMATCH);
        PyObject *cls = key && error_classes ? PyDict_GetItemWithError(error_classes, key) : NULL;
        Py_XDECREF(key);
        if (PyErr_Occurred())
            return NULL;
        PyObject *e = PyObject_CallFunction(cls ? cls : PyExc_ValueError, "Ni",
                                            PyUnicode_FromFormat("from_dlpack: the tensor is on DLPack device (%d, "
                                                                 "%d), not the (%ld, %ld) its __dlpack_device__ "
                                                                 "said", (int)t->device.device_type,
                                                                 (int)t->device.device_id, want_type, want_id),
                                            (int)MAPPING_ERR_DEVICE_MISMATCH);
        if (e) {
            PyErr_SetObject((PyObject *)Py_TYPE(e), e);
            Py_DECREF(e);
        }
        return NULL;
    }
    if (t->dtype.lanes != 1 || t->dtype.bits % 8 || t->ndim < 0 || t->ndim > 32 || (t->ndim > 0 && !t->shape)) {
        PyErr_SetString(PyExc_ValueError, "from_dlpack: only plain dtypes of whole bytes, up to 32 dimensions");
        return NULL;
    }
    size_t item = t->dtype.bits / 8, n = item;
    int64_t expect = 1;
    int empty = 0; /* an empty tensor is contiguous whatever its strides (numpy gives (0, 3) strides of 0) */
    for (int i = 0; i < t->ndim; i++)
        empty |= t->shape[i] == 0;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "from_dlpack: a negative dimension");
            return NULL;
        }
        if (t->strides && !empty && t->shape[i] > 1 && t->strides[i] != expect) {
            PyErr_SetString(PyExc_ValueError, "from_dlpack: the tensor is not C-contiguous");
            return NULL;
        }
        if (n && (size_t)t->shape[i] > SIZE_MAX / n) {
            PyErr_SetString(PyExc_ValueError, "from_dlpack: the tensor's size overflows");
            return NULL;
        }
        if (t->shape[i] && expect > INT64_MAX / t->shape[i])
            expect = INT64_MAX; /* only compared with strides of larger dimensions: any mismatch is one */
        else
            expect *= t->shape[i];
        n *= (size_t)t->shape[i];
    }
    PyObject *shape = PyTuple_New(t->ndim);
    if (!shape)
        return NULL;
    for (int i = 0; i < t->ndim; i++) {
        PyObject *d = PyLong_FromLongLong(t->shape[i]);
        if (!d) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, d);
    }
    mapping_buffer *buf = NULL;
    if (n > 0) {
        mapping_status st = mapping_import_gpu(dev, t->data, (size_t)t->byte_offset, n, dl_import_release, m, &buf);
        if (st != MAPPING_OK) {
            Py_DECREF(shape);
            return raise_status(st);
        }
    }
    if (PyCapsule_SetName(args[1], "used_dltensor") < 0) {
        Py_DECREF(shape);
        return NULL;
    }
    /* read before the deleter below frees the tensor (an empty array's was read after it) */
    int dev_type = t->device.device_type, dev_id = t->device.device_id, code = t->dtype.code, bits = t->dtype.bits;
    if (n == 0 && m->deleter) /* nothing imported: done with it now */
        m->deleter(m);
    return Py_BuildValue("(NiiN(ii)n)", from_ptr(buf), dev_type, dev_id, shape, code, bits, (Py_ssize_t)n);
}

/* ---- the C baseline for python/bench.py: bench_copies(buf, obj, iters, to_gpu)
 * makes `iters` blocking copies of obj's bytes in a C loop and returns the
 * seconds they took, so Python's per-call cost is measured against the C
 * call in the same process. ---- */
#include <time.h>
static PyObject *core_bench_copies(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    NEED(4);
    mapping_buffer *b = PTR(0);
    long iters = PyLong_AsLong(args[2]);
    int to_gpu = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (get_view(args[1], &view, !to_gpu, "array") < 0)
        return NULL;
    mapping_status st = MAPPING_OK;
    struct timespec t0, t1;
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < iters && st == MAPPING_OK; i++)
        st = to_gpu ? mapping_sync_to_gpu_range(NULL, view.buf, b, 0, (size_t)view.len)
                    : mapping_sync_to_cpu_range(NULL, b, 0, view.buf, (size_t)view.len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    CHECK_ST(st);
    return PyFloat_FromDouble((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}

static PyObject *core_version(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(mapping_version());
}

/* (mechanism, granularity in bytes, description) of write tracking in this
 * process (mapping_write_tracking). */
static PyObject *core_write_tracking(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    size_t granularity = 0;
    mapping_track_mechanism mech = mapping_write_tracking(&granularity);
    const char *name = mech == MAPPING_TRACK_UFFD ? "uffd" : mech == MAPPING_TRACK_MPROTECT ? "mprotect" : "none";
    PyObject *why = text(mapping_write_tracking_description());
    if (!why)
        return NULL;
    return Py_BuildValue("(snN)", name, (Py_ssize_t)granularity, why);
}

/* ---- the table-driven calls ----
 * Most of the C API is "convert some handles and sizes, call, raise the
 * status, return None or the new handle". Each such call is one row of
 * `calls` below: its Python name, its argument kinds (a string, one letter
 * per argument: p handle/pointer (None: NULL), s size_t (>= 0), i long,
 * u unsigned, b a byte 0..255), whether the C call may block (the GIL is
 * released around it), what it returns, and a one-line thunk that calls the
 * C function with the converted arguments. One generic function
 * (table_call) does the conversion, the checks and the reference counting
 * for all of them. */
enum { RET_NONE, RET_HANDLE }; /* RET_HANDLE: the thunk gets an out pointer as a[nargs] */

typedef struct {
    PyMethodDef def; /* name, table_call, METH_FASTCALL */
    const char *kinds;
    int         blocking;
    int         ret;
    mapping_status (*thunk)(const uintptr_t *a);
} call_row;

#define ARG(i, T) ((T)a[i])
#define THUNK(name, call)                                       \
    static mapping_status t_##name(const uintptr_t *a)          \
    {                                                           \
        return call;                                            \
    }
#define VOID_THUNK(name, call)                                  \
    static mapping_status t_##name(const uintptr_t *a)          \
    {                                                           \
        call;                                                   \
        return MAPPING_OK;                                      \
    }
#define D_ ARG(0, mapping_device *)
#define S_(i) ARG(i, mapping_stream *)
#define B_(i) ARG(i, mapping_buffer *)
#define M_(i) ARG(i, mapping_mirror *)
#define Z_(i) ARG(i, size_t)
#define OUT_(i, T) ARG(i, T **)

VOID_THUNK(close, mapping_close(D_))
VOID_THUNK(stats_reset, mapping_device_stats_reset(D_))
THUNK(open_opencl, mapping_open_opencl(ARG(0, void *), ARG(1, void *), ARG(2, void *), OUT_(3, mapping_device)))
THUNK(allocate_gpu, mapping_allocate_gpu(D_, Z_(1), OUT_(2, mapping_buffer)))
THUNK(import_gpu, mapping_import_gpu(D_, ARG(1, void *), Z_(2), Z_(3), NULL, NULL, OUT_(4, mapping_buffer)))
VOID_THUNK(free_gpu, mapping_free_gpu(B_(0)))
THUNK(buffer_native, mapping_buffer_native(B_(0), OUT_(1, void)))
THUNK(copy_gpu, mapping_copy_gpu(S_(0), B_(1), Z_(2), B_(3), Z_(4), Z_(5)))
THUNK(copy_peer, mapping_copy_peer(S_(0), B_(1), Z_(2), B_(3), Z_(4), Z_(5)))
THUNK(fill_gpu, mapping_fill_gpu(S_(0), B_(1), Z_(2), Z_(3), ARG(4, unsigned char)))
THUNK(allocate_cpu, mapping_allocate_cpu(D_, Z_(1), OUT_(2, void)))
VOID_THUNK(free_cpu, mapping_free_cpu(D_, ARG(1, void *)))
THUNK(stream_create, mapping_stream_create(D_, OUT_(1, mapping_stream)))
THUNK(import_stream, mapping_import_stream(D_, ARG(1, void *), OUT_(2, mapping_stream)))
THUNK(device_wait_native, mapping_device_wait_native(D_, ARG(1, void *)))
VOID_THUNK(stream_destroy, mapping_stream_destroy(S_(0)))
THUNK(stream_native, mapping_stream_native(S_(0), OUT_(1, void)))
THUNK(event_record, mapping_event_record(S_(0), OUT_(1, mapping_event)))
THUNK(stream_wait_event, mapping_stream_wait_event(S_(0), ARG(1, mapping_event *)))
THUNK(event_sync, mapping_event_synchronize(ARG(0, mapping_event *)))
VOID_THUNK(event_destroy, mapping_event_destroy(ARG(0, mapping_event *)))
THUNK(mirror_create, mapping_mirror_create(D_, Z_(1), ARG(2, unsigned), OUT_(3, mapping_mirror)))
VOID_THUNK(mirror_destroy, mapping_mirror_destroy(M_(0)))
THUNK(mirror_view, mapping_mirror_view(M_(0), Z_(1), Z_(2), OUT_(3, mapping_mirror)))
THUNK(mirror_mark, ARG(1, long) == MAPPING_CPU ? mapping_mirror_mark_cpu_modified(M_(0), Z_(2), Z_(3))
                                               : mapping_mirror_mark_gpu_modified(M_(0), Z_(2), Z_(3)))
THUNK(mirror_sync, ARG(2, long) == MAPPING_CPU ? mapping_mirror_sync_to_cpu(S_(0), M_(1))
                                               : mapping_mirror_sync_to_gpu(S_(0), M_(1)))
THUNK(mirror_sync_in_graph, mapping_mirror_sync_in_graph(S_(0), M_(1), (mapping_side)ARG(2, long), Z_(3)))
/* 1 / 0 as a "handle" (an int to Python). */
static mapping_status t_stream_capturing(const uintptr_t *a)
{
    int on = 0;
    mapping_status st = mapping_stream_capturing(S_(0), &on);
    *OUT_(1, void) = (void *)(uintptr_t)on;
    return st;
}
THUNK(mirror_acquire_cpu, mapping_mirror_acquire_cpu(M_(0), ARG(1, unsigned), OUT_(2, void)))
THUNK(mirror_acquire_gpu, mapping_mirror_acquire_gpu(S_(0), M_(1), ARG(2, unsigned), OUT_(3, mapping_buffer)))
THUNK(mirror_release_gpu, mapping_mirror_release_gpu(S_(0), M_(1)))
THUNK(mirror_evict, mapping_mirror_evict(M_(0)))
THUNK(mirror_set_residency, mapping_mirror_set_residency(M_(0), (mapping_residency)ARG(1, long)))
THUNK(set_memory_budget, mapping_device_set_memory_budget(D_, (uint64_t)Z_(1)))
THUNK(multimirror_evict, mapping_multimirror_evict(ARG(0, mapping_multimirror *), ARG(1, int)))
THUNK(batch_create, mapping_batch_create(D_, OUT_(1, mapping_batch)))
VOID_THUNK(batch_destroy, mapping_batch_destroy(ARG(0, mapping_batch *)))
THUNK(batch_flush, mapping_batch_flush(S_(0), ARG(1, mapping_batch *)))
VOID_THUNK(batch_clear, mapping_batch_clear(ARG(0, mapping_batch *)))
VOID_THUNK(pipeline_destroy, mapping_pipeline_destroy(ARG(0, mapping_pipeline *)))
VOID_THUNK(multimirror_destroy, mapping_multimirror_destroy(ARG(0, mapping_multimirror *)))
THUNK(multimirror_mark, ARG(1, long) < 0
                            ? mapping_multimirror_mark_cpu_modified(ARG(0, mapping_multimirror *), Z_(2), Z_(3))
                            : mapping_multimirror_mark_gpu_modified(ARG(0, mapping_multimirror *), ARG(1, int), Z_(2),
                                                                    Z_(3)))
THUNK(multimirror_sync, ARG(2, long) < 0
                            ? mapping_multimirror_sync_to_cpu(ARG(1, mapping_multimirror *))
                            : mapping_multimirror_sync_to_gpu(S_(0), ARG(1, mapping_multimirror *), ARG(2, int)))

static PyObject *table_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define ROW(name, kinds, blocking, ret) \
    {{#name, (PyCFunction)(void (*)(void))table_call, METH_FASTCALL, NULL}, kinds, blocking, ret, t_##name}

static call_row calls[] = {
    ROW(close, "p", 1, RET_NONE),
    ROW(stats_reset, "p", 0, RET_NONE),
    ROW(open_opencl, "ppp", 0, RET_HANDLE),
    ROW(allocate_gpu, "ps", 0, RET_HANDLE),
    ROW(import_gpu, "ppss", 0, RET_HANDLE),
    ROW(free_gpu, "p", 1, RET_NONE), /* a release callback (DLPack) takes the GIL itself */
    ROW(buffer_native, "p", 0, RET_HANDLE),
    ROW(copy_gpu, "ppspss", 1, RET_NONE),
    ROW(copy_peer, "ppspss", 1, RET_NONE),
    ROW(fill_gpu, "ppssb", 1, RET_NONE),
    ROW(allocate_cpu, "ps", 0, RET_HANDLE),
    ROW(free_cpu, "pp", 0, RET_NONE),
    ROW(stream_create, "p", 0, RET_HANDLE),
    ROW(import_stream, "pp", 0, RET_HANDLE),
    ROW(device_wait_native, "pp", 0, RET_NONE),
    ROW(stream_destroy, "p", 1, RET_NONE),
    ROW(stream_native, "p", 0, RET_HANDLE),
    ROW(event_record, "p", 1, RET_HANDLE), /* a full queue waits for its thread, which may want the GIL */
    ROW(stream_wait_event, "pp", 1, RET_NONE),
    ROW(event_sync, "p", 1, RET_NONE),
    ROW(event_destroy, "p", 0, RET_NONE),
    ROW(mirror_create, "psu", 1, RET_HANDLE),
    ROW(mirror_destroy, "p", 1, RET_NONE),
    ROW(mirror_view, "pss", 0, RET_HANDLE),
    ROW(mirror_mark, "piss", 1, RET_NONE),
    ROW(mirror_sync, "ppi", 1, RET_NONE),
    ROW(mirror_sync_in_graph, "ppis", 1, RET_NONE),
    ROW(stream_capturing, "p", 0, RET_HANDLE),
    ROW(mirror_acquire_cpu, "pu", 1, RET_HANDLE),
    ROW(mirror_acquire_gpu, "ppu", 1, RET_HANDLE),
    ROW(mirror_release_gpu, "pp", 1, RET_NONE),
    ROW(mirror_evict, "p", 1, RET_NONE),
    ROW(mirror_set_residency, "pi", 0, RET_NONE),
    ROW(set_memory_budget, "ps", 1, RET_NONE), /* it may evict: a write-back */
    ROW(multimirror_evict, "pi", 1, RET_NONE),
    ROW(batch_create, "p", 0, RET_HANDLE),
    ROW(batch_destroy, "p", 1, RET_NONE),
    ROW(batch_flush, "pp", 1, RET_NONE),
    ROW(batch_clear, "p", 0, RET_NONE),
    ROW(pipeline_destroy, "p", 1, RET_NONE),
    ROW(multimirror_destroy, "p", 1, RET_NONE),
    ROW(multimirror_mark, "piss", 1, RET_NONE),
    ROW(multimirror_sync, "ppi", 1, RET_NONE),
};

enum { TABLE_MAX_ARGS = 7 };

/* self: the row's index into `calls` (a PyLong, set when the builtin is made). */
static PyObject *table_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const call_row *row = &calls[PyLong_AsSsize_t(self)];
    Py_ssize_t want = (Py_ssize_t)strlen(row->kinds);
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s expected %zd arguments, got %zd", row->def.ml_name, want, nargs);
        return NULL;
    }
    uintptr_t a[TABLE_MAX_ARGS + 1] = {0};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *o = args[i];
        switch (row->kinds[i]) {
        case 'p':
            a[i] = (uintptr_t)as_ptr(o);
            break;
        case 's': {
            size_t v;
            if (get_size(o, &v) < 0)
                return NULL;
            a[i] = (uintptr_t)v;
            break;
        }
        case 'i':
            a[i] = (uintptr_t)PyLong_AsLong(o);
            break;
        case 'u':
            a[i] = (uintptr_t)PyLong_AsUnsignedLong(o);
            break;
        case 'b': {
            long v = PyLong_AsLong(o);
            if (!PyErr_Occurred() && (v < 0 || v > 255)) {
                PyErr_Format(PyExc_ValueError, "%s: value %ld is not a byte (0..255)", row->def.ml_name, v);
                return NULL;
            }
            a[i] = (uintptr_t)v;
            break;
        }
        }
        if (PyErr_Occurred())
            return NULL;
    }
    void *out = NULL;
    if (row->ret == RET_HANDLE)
        a[nargs] = (uintptr_t)&out;
    mapping_status st;
    if (row->blocking) {
        Py_BEGIN_ALLOW_THREADS
        st = row->thunk(a);
        Py_END_ALLOW_THREADS
    } else {
        st = row->thunk(a);
    }
    CHECK_ST(st);
    if (row->ret == RET_HANDLE)
        return from_ptr(out);
    Py_RETURN_NONE;
}

/* Adds every row to the module: one builtin per row, its self the row's index. */
static int add_table_calls(PyObject *m)
{
    PyObject *modname = PyModule_GetNameObject(m);
    if (!modname)
        return -1;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        PyObject *index = PyLong_FromSize_t(i);
        PyObject *f = index ? PyCFunction_NewEx(&calls[i].def, index, modname) : NULL;
        Py_XDECREF(index);
        if (!f || PyModule_AddObject(m, calls[i].def.ml_name, f) < 0) {
            Py_XDECREF(f);
            Py_DECREF(modname);
            return -1;
        }
    }
    Py_DECREF(modname);
    return 0;
}

/* ---- FamilyLock: the Python layer's one-call-at-a-time lock of a mirror
 * family, batch, pipeline or multimirror (mapping/__init__.py, _Family
 * subclasses it). Re-entrant for its owner thread. Taken and given back in C:
 * a Python-level __enter__ / __exit__ runs pending signal handlers between
 * the acquire (or before the release) and the with statement's protection,
 * so a KeyboardInterrupt there left the lock held for good.
 * - __enter__ waits for it; on a thread running a launch_host function
 *   (host_fn_flag) at most HOST_FN_WAIT seconds, then raises the BusyError
 *   given at construction: the thread holding it may be waiting for the
 *   very stream that function runs on.
 * - __exit__ gives it back; then, if handles were left to destroy
 *   (`pending`, set by _Family.destroy), reap() runs.
 * - reap() takes it only if free (or already ours) and calls
 *   self._reap_locked(), giving it back in the same C call. ---- */
enum { HOST_FN_WAIT_US = 1000000 };

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;  /* never NULL: made by fl_new */
    unsigned long      owner;
    long               count;
    int                pending;
    PyObject          *busy;
    unsigned long      gen;   /* fork_generation when last used */
} family_lock;

static PyObject *core_host_fn_flag(PyObject *self, PyObject *arg)
{
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = in_host_fn;
    in_host_fn = on;
    return PyBool_FromLong(was);
}

/* The lock is made here, not in __init__: an object made with
 * FamilyLock.__new__ alone (type(m._lock).__new__(...)) had none, and its
 * first `with` dereferenced NULL. */
static PyObject *fl_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    family_lock *self = (family_lock *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->gen = fork_generation;
    if (!(self->lock = PyThread_allocate_lock())) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static int fl_init(family_lock *self, PyObject *args, PyObject *kw)
{
    PyObject *busy;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "FamilyLock(busy_error_class) takes no keywords");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O:FamilyLock", &busy))
        return -1;
    Py_INCREF(busy);
    Py_XSETREF(self->busy, busy);
    return 0;
}

/* In a child after os.fork() the forking thread is the only one: a lock a
 * thread of the parent held (or was taking, its count not yet set) would
 * never be given back, and the child's next call on the family waited for
 * it for good. Unless the forking thread itself holds it, the lock is
 * replaced by a new, free one (the old one is left: it may be held). */
static int fl_after_fork(family_lock *self)
{
    if (self->gen == fork_generation)
        return 0;
    if (!(self->count > 0 && self->owner == PyThread_get_thread_ident())) {
        PyThread_type_lock lock = PyThread_allocate_lock();
        if (!lock) {
            PyErr_NoMemory();
            return -1;
        }
        self->lock = lock;
        self->count = 0;
        self->owner = 0;
    }
    self->gen = fork_generation;
    return 0;
}

static void fl_dealloc(family_lock *self)
{
    if (self->lock && self->gen == fork_generation) { /* else: possibly held by a thread the child lacks */
        if (self->count)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_XDECREF(self->busy);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 taken, 0 not (timeout, or not free and !wait), -1 an error (set). */
static int fl_take(family_lock *self, int wait, PY_TIMEOUT_T timeout_us)
{
    if (fl_after_fork(self) < 0)
        return -1;
    unsigned long me = PyThread_get_thread_ident();
    if (self->count > 0 && self->owner == me) {
        self->count++;
        return 1;
    }
    PyLockStatus r = PyThread_acquire_lock_timed(self->lock, 0, 0);
    if (r != PY_LOCK_ACQUIRED && wait) {
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, timeout_us, 0);
        Py_END_ALLOW_THREADS
    }
    if (r != PY_LOCK_ACQUIRED)
        return 0;
    self->owner = me;
    self->count = 1;
    return 1;
}

static int fl_give(family_lock *self)
{
    if (self->count == 0 || self->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "mapping: a family lock released by a thread that does not hold it");
        return -1;
    }
    if (--self->count == 0) {
        self->owner = 0;
        PyThread_release_lock(self->lock);
    }
    return 0;
}

static PyObject *fl_reap(family_lock *self, PyObject *unused)
{
    (void)unused;
    int took = self->pending ? fl_take(self, 0, 0) : 0;
    if (took < 0)
        return NULL;
    if (!took)
        Py_RETURN_NONE; /* nothing left, or another thread holds it: it reaps when it lets go */
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_reap_locked", NULL);
    if (fl_give(self) < 0) {
        Py_XDECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *fl_enter(family_lock *self, PyObject *unused)
{
    (void)unused;
    int took = fl_take(self, 1, in_host_fn ? (PY_TIMEOUT_T)HOST_FN_WAIT_US : (PY_TIMEOUT_T)-1);
    if (took < 0)
        return NULL;
    if (!took) {
        PyObject *kind = PyObject_GetAttrString((PyObject *)self, "kind");
        PyObject *e = kind ? PyObject_CallFunction(self->busy ? self->busy : PyExc_RuntimeError, "Ni",
                                                   PyUnicode_FromFormat("this %S is in use by another thread (called "
                                                                        "from a launch_host function, which that "
                                                                        "thread may be waiting for)", kind),
                                                   -18)
                           : NULL;
        Py_XDECREF(kind);
        if (e) {
            PyErr_SetObject((PyObject *)Py_TYPE(e), e);
            Py_DECREF(e);
        }
        return NULL;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *fl_exit(family_lock *self, PyObject *args)
{
    (void)args;
    if (fl_give(self) < 0)
        return NULL;
    if (self->count == 0 && self->pending) {
        PyObject *r = fl_reap(self, NULL);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_FALSE;
}

static PyObject *fl_owned(family_lock *self, PyObject *unused)
{
    (void)unused;
    if (fl_after_fork(self) < 0)
        return NULL;
    return PyBool_FromLong(self->count > 0 && self->owner == PyThread_get_thread_ident());
}

static PyObject *fl_locked(family_lock *self, PyObject *unused)
{
    (void)unused;
    if (fl_after_fork(self) < 0)
        return NULL;
    return PyBool_FromLong(self->count > 0);
}

static PyMethodDef fl_methods[] = {
    {"__enter__", (PyCFunction)fl_enter, METH_NOARGS, "waits for the lock (re-entrant)"},
    {"__exit__", (PyCFunction)fl_exit, METH_VARARGS, "gives it back, then reaps left handles"},
    {"reap", (PyCFunction)fl_reap, METH_NOARGS, "self._reap_locked() now if the lock is free or ours"},
    {"_is_owned", (PyCFunction)fl_owned, METH_NOARGS, "held by this thread"},
    {"locked", (PyCFunction)fl_locked, METH_NOARGS, "held by some thread"},
    {NULL, NULL, 0, NULL}};
static PyMemberDef fl_members[] = {{"pending", T_INT, offsetof(family_lock, pending), 0, "handles wait to be destroyed"},
                                   {NULL, 0, 0, 0, NULL}};
static PyTypeObject family_lock_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mapping._core.FamilyLock",
    .tp_basicsize = sizeof(family_lock),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = fl_new,
    .tp_init = (initproc)fl_init,
    .tp_dealloc = (destructor)fl_dealloc,
    .tp_methods = fl_methods,
    .tp_members = fl_members,
    .tp_doc = "one call at a time on a family (mapping._Family)",
};

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))core_##name, METH_FASTCALL, doc}
#define ONE(name, doc) {#name, (PyCFunction)core_##name, METH_O, doc}
#define VAR(name, doc) {#name, (PyCFunction)core_##name, METH_VARARGS, doc}
#define NONE_(name, doc) {#name, (PyCFunction)core_##name, METH_NOARGS, doc}

static PyMethodDef core_methods[] = {
    VAR(set_errors, NULL), NONE_(statuses, NULL), NONE_(version, NULL), NONE_(write_tracking, NULL), VAR(open, NULL), ONE(device_info, NULL), ONE(native_device, NULL), NONE_(list, NULL), ONE(stats, NULL),
    ONE(device_link, NULL), FAST(device_set_link, NULL), FAST(write, NULL), FAST(read, NULL), FAST(address_of, NULL), ONE(stream_sync, NULL), ONE(event_query, NULL),
    FAST(event_elapsed, NULL), FAST(mirror_wrap, NULL),
    FAST(mirror_adopt, NULL), ONE(mirror_parts, NULL),
    FAST(mirror_stale, NULL), FAST(mirror_needs_sync, NULL), FAST(batch_add, NULL), ONE(batch_count, NULL),
    FAST(pipeline_create, NULL), FAST(pipeline_run, NULL),
    VAR(to_dlpack, NULL), FAST(import_dlpack, NULL), FAST(bench_copies, NULL), FAST(pin, NULL), FAST(mirror_sharded, NULL), FAST(multimirror_create, NULL), FAST(multimirror_parts, NULL),
    FAST(multimirror_stale, NULL), ONE(memory_budget, NULL), ONE(mirror_resident, NULL), FAST(multimirror_resident, NULL),
    FAST(keep_until, NULL), FAST(queued, NULL), NONE_(drain, NULL), NONE_(after_fork_child, NULL),
    FAST(launch_host, NULL), ONE(host_fn_flag, NULL), NONE_(host_fns_pending, NULL), NONE_(in_host_fn, NULL),
    ONE(defer, NULL), NONE_(exit_gate, NULL),
    {"_text", (PyCFunction)core_text, METH_O, "bytes from a driver as str (undecodable bytes replaced)"}, {NULL, NULL, 0, NULL}};

static struct PyModuleDef core_module = {PyModuleDef_HEAD_INIT, "mapping._core",
                                         "libmapping's C API for the mapping package", -1, core_methods,
                                         NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void)
{
    if (PyType_Ready(&host_memory_type) < 0 || PyType_Ready(&pin_type) < 0 || PyType_Ready(&family_lock_type) < 0)
        return NULL;
    if (!done_lock && !(done_lock = PyThread_allocate_lock()))
        return PyErr_NoMemory();
    if (!py_gate && !(py_gate = PyThread_allocate_lock()))
        return PyErr_NoMemory();
    py_interp = PyInterpreterState_Get();
    PyObject *m = PyModule_Create(&core_module);
    if (!m)
        return NULL;
    Py_INCREF(&host_memory_type);
    if (PyModule_AddObject(m, "HostMemory", (PyObject *)&host_memory_type) < 0) {
        Py_DECREF(&host_memory_type);
        goto fail;
    }
    Py_INCREF(&family_lock_type);
    if (PyModule_AddObject(m, "FamilyLock", (PyObject *)&family_lock_type) < 0) {
        Py_DECREF(&family_lock_type);
        goto fail;
    }
    if (add_table_calls(m) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "MIRROR_UNIFIED", MAPPING_MIRROR_UNIFIED) < 0 ||
        PyModule_AddIntConstant(m, "MIRROR_PIN", MAPPING_MIRROR_PIN) < 0 ||
        PyModule_AddIntConstant(m, "MIRROR_GPU_VALID", MAPPING_MIRROR_GPU_VALID) < 0 ||
        PyModule_AddIntConstant(m, "MIRROR_TRACK_WRITES", MAPPING_MIRROR_TRACK_WRITES) < 0 ||
        PyModule_AddIntConstant(m, "MIRROR_DEVICE_DIFF", MAPPING_MIRROR_DEVICE_DIFF) < 0 ||
        PyModule_AddIntConstant(m, "CPU", MAPPING_CPU) < 0 || PyModule_AddIntConstant(m, "GPU", MAPPING_GPU) < 0 ||
        PyModule_AddIntConstant(m, "READ", MAPPING_READ) < 0 || PyModule_AddIntConstant(m, "WRITE", MAPPING_WRITE) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
