/*
 * mapping._mpi: libmapping_mpi (src/mpi/, compiled into this module) for
 * mapping.mpi (mapping/mpi.py), over mpi4py's communicators.
 *
 * One libmapping per process: this module carries none. Its libmapping calls
 * resolve to mapping._core's copy, which mapping/mpi.py makes global
 * (RTLD_GLOBAL) before importing this module, so the devices, streams and
 * mirrors of mapping and of mapping.mpi are the same objects. Handles travel
 * as Python ints, as in mapping._core.
 *
 * Every collective call releases the GIL and waits in libmapping_mpi's
 * polling loop; its progress function (below) takes the GIL every 5 ms to
 * run Python's signal handlers (Ctrl-C, an alarm), gives up at the timeout
 * (set_timeout), and when a failure notice arrived on any live array of this
 * process. The Python layer turns each outcome into its exception.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "mpi/mpi_internal.h"

static PyObject *error_classes, *error_base, *peer_error, *timeout_error;
static double    timeout_s; /* 0: wait for ever (as MPI does) */

/* ---- the arrays this module made and has not destroyed ---- */

static mapping_mpi_darray **live;
static Py_ssize_t           live_count, live_cap;

static int live_add(mapping_mpi_darray *a)
{
    if (live_count == live_cap) {
        Py_ssize_t cap = live_cap ? 2 * live_cap : 8;
        mapping_mpi_darray **grown = PyMem_Realloc(live, (size_t)cap * sizeof *live);
        if (!grown)
            return -1;
        live = grown;
        live_cap = cap;
    }
    live[live_count++] = a;
    return 0;
}

static int live_remove(mapping_mpi_darray *a)
{
    for (Py_ssize_t i = 0; i < live_count; i++)
        if (live[i] == a) {
            live[i] = live[--live_count];
            return 1;
        }
    return 0;
}

/* a, if this module made it and it is alive; else NULL with ValueError set. */
static mapping_mpi_darray *array_of(PyObject *o)
{
    void *p = PyLong_AsVoidPtr(o);
    if (!p && PyErr_Occurred())
        return NULL;
    for (Py_ssize_t i = 0; i < live_count; i++)
        if (live[i] == p)
            return p;
    PyErr_SetString(PyExc_ValueError, "not a live distributed array of this process");
    return NULL;
}

/* ---- waits ---- */

enum { WAIT_DONE, WAIT_SIGNAL, WAIT_TIMEOUT, WAIT_PEER };
enum { CHECK_EVERY_MS = 5 }; /* signals, notices before a call and on other arrays: at most this often */

typedef struct wait_state {
    double    deadline, next_check;
    int       reason;
    unsigned  rounds;
    PyObject *exc[3]; /* a signal handler's exception (type, value, traceback; 3.12: the exception) */
    int       peer_rank;
    char      peer_why[256];
} wait_state;

static _Thread_local wait_state *waiting; /* this thread's call, if it waits in one */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* With the GIL: a new failure notice on a live array (not one this process
 * already acted on: it has sent its own notices then). */
static int any_notice(wait_state *w)
{
    for (Py_ssize_t i = 0; i < live_count; i++)
        if (!live[i]->notice_sends && live[i]->notice_from < 0 &&
            mapping_mpi_darray_peer_failed(live[i], &w->peer_rank, w->peer_why, sizeof w->peer_why))
            return 1;
    return 0;
}

/* libmapping_mpi's progress function: called on every round of a wait. */
static int progress(void *user)
{
    (void)user;
    wait_state *w = waiting;
    if (!w || (++w->rounds & 15) != 0) /* the clock every 16th round: a round is one MPI_Testsome */
        return 0;
    double t = now();
    if (w->deadline > 0 && t > w->deadline) {
        w->reason = WAIT_TIMEOUT;
        return 1;
    }
    if (t < w->next_check)
        return 0;
    w->next_check = t + 1e-3 * CHECK_EVERY_MS;
    PyGILState_STATE g = PyGILState_Ensure();
    if (PyErr_CheckSignals() < 0) {
#if PY_VERSION_HEX >= 0x030C0000
        w->exc[0] = PyErr_GetRaisedException();
#else
        PyErr_Fetch(&w->exc[0], &w->exc[1], &w->exc[2]);
#endif
        w->reason = WAIT_SIGNAL;
    } else if (any_notice(w)) {
        w->reason = WAIT_PEER;
    }
    PyGILState_Release(g);
    return w->reason != WAIT_DONE;
}

static void wait_begin(wait_state *w, wait_state **outer)
{
    memset(w, 0, sizeof *w);
    double t = now();
    w->peer_rank = -1;
    w->deadline = timeout_s > 0 ? t + timeout_s : 0;
    w->next_check = t + 1e-3 * CHECK_EVERY_MS; /* a short wait takes no GIL */
    *outer = waiting;
    waiting = w;
}

static PyObject *raise_status(mapping_status st)
{
    PyObject *cls = NULL;
    if (error_classes) {
        PyObject *key = PyLong_FromLong(st);
        cls = key ? PyDict_GetItemWithError(error_classes, key) : NULL;
        Py_XDECREF(key);
    }
    if (!cls && PyErr_Occurred())
        return NULL;
    if (!cls)
        cls = error_base ? error_base : PyExc_RuntimeError;
    const char *msg = mapping_mpi_last_error_message();
    PyObject *args = Py_BuildValue("(s,i)", msg && *msg ? msg : mapping_status_string(st), (int)st);
    if (args) {
        PyErr_SetObject(cls, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* The exception for a call that returned st after the wait w (NULL: none
 * to raise, st is MAPPING_OK). A is the array (may be NULL). */
static PyObject *wait_end(wait_state *w, wait_state *outer, mapping_status st, mapping_mpi_darray *a)
{
    waiting = outer;
    if (w->reason == WAIT_SIGNAL) {
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(w->exc[0]);
#else
        PyErr_Restore(w->exc[0], w->exc[1], w->exc[2]);
#endif
        return NULL;
    }
    if (st == MAPPING_OK)
        return Py_NewRef(Py_None);
    if (w->reason != WAIT_PEER && a &&
        mapping_mpi_darray_peer_failed(a, &w->peer_rank, w->peer_why, sizeof w->peer_why))
        w->reason = WAIT_PEER;
    if (w->reason == WAIT_PEER && peer_error) {
        PyObject *args = Py_BuildValue("(isi)", w->peer_rank, w->peer_why, (int)st);
        if (args) {
            PyErr_SetObject(peer_error, args);
            Py_DECREF(args);
        }
        return NULL;
    }
    if (w->reason == WAIT_TIMEOUT && timeout_error) {
        char text[768];
        snprintf(text, sizeof text, "gave up waiting for the other ranks after %g s (mapping.mpi.set_timeout): %s",
                 timeout_s, mapping_mpi_last_error_message());
        PyErr_SetString(timeout_error, text);
        return NULL;
    }
    return raise_status(st);
}

/* A notice that came for array a before a call: the call is not made (it
 * would wait for the rank that failed, or succeed where the others fail).
 * Tested at most every CHECK_EVERY_MS (an MPI_Test is a progress call);
 * between, the call's own wait watches for it. */
static int noticed(wait_state *w, mapping_mpi_darray *a)
{
    static double next;
    if (!a || a->notice_sends)
        return 0;
    if (a->notice_from < 0) {
        double t = w->next_check - 1e-3 * CHECK_EVERY_MS; /* now, read by wait_begin */
        if (t < next)
            return 0;
        next = t + 1e-3 * CHECK_EVERY_MS;
    }
    if (!mapping_mpi_darray_peer_failed(a, &w->peer_rank, w->peer_why, sizeof w->peer_why))
        return 0;
    w->reason = WAIT_PEER;
    return 1;
}

/* Runs CALL (a mapping_status expression) without the GIL in a wait that
 * gives up, and evaluates to the outcome (a new reference or NULL). */
#define WAITING(result, a, call)                      \
    do {                                              \
        wait_state w_, *outer_;                       \
        mapping_status st_ = MAPPING_ERR_NOT_READY;   \
        wait_begin(&w_, &outer_);                     \
        if (!noticed(&w_, (a))) {                     \
            Py_BEGIN_ALLOW_THREADS                    \
            st_ = (call);                             \
            Py_END_ALLOW_THREADS                      \
        }                                             \
        (result) = wait_end(&w_, outer_, st_, (a));   \
    } while (0)

/* ---- mpi4py's communicators ---- */

typedef MPI_Comm *(*comm_get_fn)(PyObject *);

/* MPI_Comm of an mpi4py.MPI.Comm: mpi4py's C API (PyMPIComm_Get), else
 * comm.py2f() and MPI_Comm_f2c. */
static int get_comm(PyObject *obj, MPI_Comm *out)
{
    static comm_get_fn comm_get;
    if (!comm_get) {
        PyObject *mod = PyImport_ImportModule("mpi4py.MPI");
        PyObject *capi = mod ? PyObject_GetAttrString(mod, "__pyx_capi__") : NULL;
        PyObject *cap = capi && PyDict_Check(capi) ? PyDict_GetItemString(capi, "PyMPIComm_Get") : NULL;
        if (cap && PyCapsule_CheckExact(cap) && PyCapsule_GetName(cap) &&
            strcmp(PyCapsule_GetName(cap), "MPI_Comm *(PyObject *)") == 0)
            comm_get = (comm_get_fn)PyCapsule_GetPointer(cap, PyCapsule_GetName(cap));
        Py_XDECREF(capi);
        Py_XDECREF(mod);
        PyErr_Clear();
    }
    if (comm_get) {
        MPI_Comm *p = comm_get(obj);
        if (!p)
            return -1;
        *out = *p;
        return 0;
    }
    PyObject *f = PyObject_CallMethod(obj, "py2f", NULL);
    long v = f ? PyLong_AsLong(f) : -1;
    Py_XDECREF(f);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = MPI_Comm_f2c((MPI_Fint)v);
    return 0;
}

/* ---- module functions ---- */

static PyObject *m_set_errors(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *base, *classes, *peer, *timeout;
    if (!PyArg_ParseTuple(args, "OO!OO", &base, &PyDict_Type, &classes, &peer, &timeout))
        return NULL;
    Py_XSETREF(error_base, Py_NewRef(base));
    Py_XSETREF(error_classes, Py_NewRef(classes));
    Py_XSETREF(peer_error, Py_NewRef(peer));
    Py_XSETREF(timeout_error, Py_NewRef(timeout));
    Py_RETURN_NONE;
}

static PyObject *m_set_timeout(PyObject *self, PyObject *arg)
{
    (void)self;
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred())
        return NULL;
    timeout_s = t > 0 ? t : 0;
    Py_RETURN_NONE;
}

/* The MPI this module was built with and runs on, to compare with mpi4py's. */
static PyObject *m_abi(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0, major = 0, minor = 0;
    MPI_Get_library_version(lib, &len);
    MPI_Get_version(&major, &minor);
#if defined(OPEN_MPI) && OPEN_MPI
    PyObject *vendor = Py_BuildValue("(s(iii))", "Open MPI", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(I_MPI_VERSION)
    PyObject *vendor = Py_BuildValue("(ss)", "Intel MPI", I_MPI_VERSION);
#elif defined(MVAPICH2_VERSION)
    PyObject *vendor = Py_BuildValue("(ss)", "MVAPICH2", MVAPICH2_VERSION);
#elif defined(MPICH_VERSION)
    PyObject *vendor = Py_BuildValue("(ss)", "MPICH", MPICH_VERSION);
#else
    PyObject *vendor = Py_BuildValue("(ss)", "unknown", "");
#endif
    MPI_Comm world = MPI_COMM_WORLD;
    unsigned long long handle = 0;
    memcpy(&handle, &world, sizeof world < sizeof handle ? sizeof world : sizeof handle);
    return Py_BuildValue("{s:N,s:s,s:(ii),s:n,s:K}", "vendor", vendor, "library", lib, "standard", major, minor,
                         "comm_size", (Py_ssize_t)sizeof(MPI_Comm), "comm_world", handle);
}

/* The rank within the node (MPI_COMM_TYPE_SHARED), to pick a device. */
static PyObject *m_local_rank(PyObject *self, PyObject *arg)
{
    (void)self;
    MPI_Comm comm, node;
    if (get_comm(arg, &comm) < 0)
        return NULL;
    int local = 0, err;
    Py_BEGIN_ALLOW_THREADS
    err = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (err == MPI_SUCCESS) {
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
    }
    Py_END_ALLOW_THREADS
    if (err != MPI_SUCCESS)
        return PyErr_Format(PyExc_RuntimeError, "MPI_Comm_split_type failed (MPI error %d)", err);
    return PyLong_FromLong(local);
}

/* create(comm, rows, cols, element_bytes, halo, device) -> handle */
static PyObject *m_create(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *comm_obj, *dev_obj;
    mapping_mpi_darray_desc desc = {0};
    if (!PyArg_ParseTuple(args, "OnnnnO", &comm_obj, &desc.rows, &desc.cols, &desc.element_bytes, &desc.halo,
                          &dev_obj))
        return NULL;
    MPI_Comm comm;
    if (get_comm(comm_obj, &comm) < 0)
        return NULL;
    desc.dev = dev_obj == Py_None ? NULL : PyLong_AsVoidPtr(dev_obj);
    if (PyErr_Occurred())
        return NULL;
    if (live_count == live_cap && live_add(NULL) == 0) /* room, so the add below cannot fail */
        live_count--;
    mapping_mpi_darray *a = NULL;
    PyObject *r;
    WAITING(r, NULL, mapping_mpi_darray_create(comm, &desc, &a));
    if (!r)
        return NULL;
    Py_DECREF(r);
    if (live_add(a) < 0) {
        mapping_mpi_darray_destroy_local(a);
        return PyErr_NoMemory();
    }
    return PyLong_FromVoidPtr(a);
}

/* destroy(handle, collective): collective (a barrier first) or local. */
static PyObject *m_destroy(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *h;
    int collective;
    if (!PyArg_ParseTuple(args, "Op", &h, &collective))
        return NULL;
    mapping_mpi_darray *a = array_of(h);
    if (!a)
        return NULL;
    live_remove(a);
    if (!collective) {
        Py_BEGIN_ALLOW_THREADS
        mapping_mpi_darray_destroy_local(a);
        Py_END_ALLOW_THREADS
        Py_RETURN_NONE;
    }
    PyObject *r;
    WAITING(r, NULL, (mapping_mpi_darray_destroy(a), MAPPING_OK));
    return r;
}

static PyObject *m_info(PyObject *self, PyObject *h)
{
    (void)self;
    mapping_mpi_darray *a = array_of(h);
    mapping_mpi_darray_info i;
    if (!a || mapping_mpi_darray_get_info(a, &i) != MAPPING_OK)
        return a ? raise_status(MAPPING_ERR_INVALID_ARGUMENT) : NULL;
    return Py_BuildValue("{s:i,s:i,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:i,s:O,s:N,s:N,s:N}", "rank", i.rank, "size", i.size,
                         "rows", (Py_ssize_t)i.rows, "cols", (Py_ssize_t)i.cols, "first_row", (Py_ssize_t)i.first_row,
                         "owned_rows", (Py_ssize_t)i.owned_rows, "halo", (Py_ssize_t)i.halo, "row_bytes",
                         (Py_ssize_t)i.row_bytes, "owned_offset", (Py_ssize_t)i.owned_offset, "device_index",
                         i.device_index, "cuda_aware", mapping_mpi_cuda_aware(a) ? Py_True : Py_False, "mirror",
                         PyLong_FromVoidPtr(mapping_mpi_darray_mirror(a)), "owned",
                         PyLong_FromVoidPtr(mapping_mpi_darray_owned(a)), "device",
                         PyLong_FromVoidPtr(mapping_mpi_darray_device(a)));
}

/* exchange(handle, stream or None) */
static PyObject *m_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "exchange expected 2 arguments, got %zd", nargs);
    mapping_mpi_darray *a = array_of(args[0]);
    mapping_stream *s = args[1] == Py_None ? NULL : PyLong_AsVoidPtr(args[1]);
    if (!a || PyErr_Occurred())
        return NULL;
    PyObject *r;
    WAITING(r, a, mapping_mpi_halo_exchange(s, a));
    return r;
}

/* A buffer MPI may still use after a wait was given up (the array broken)
 * stays exported for good; else it is released. */
static void let_go(mapping_mpi_darray *a, Py_buffer *view)
{
    if (view->obj && !a->broken)
        PyBuffer_Release(view);
}

/* scatter(handle, global or None, root): the global array is read on root. */
static PyObject *m_scatter(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *h, *global;
    int root;
    if (!PyArg_ParseTuple(args, "OOi", &h, &global, &root))
        return NULL;
    mapping_mpi_darray *a = array_of(h);
    Py_buffer view = {0};
    if (!a || (global != Py_None && PyObject_GetBuffer(global, &view, PyBUF_C_CONTIGUOUS) < 0))
        return NULL;
    if (view.obj && (size_t)view.len != a->rows * a->row_bytes) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "scatter: the global array has %zd bytes, not %zu", view.len,
                            a->rows * a->row_bytes);
    }
    PyObject *r;
    WAITING(r, a, mapping_mpi_scatter(a, view.buf, root));
    let_go(a, &view);
    return r;
}

/* gather(handle, stream or None, out or None, root): out is written on root. */
static PyObject *m_gather(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *h, *stream, *out;
    int root;
    if (!PyArg_ParseTuple(args, "OOOi", &h, &stream, &out, &root))
        return NULL;
    mapping_mpi_darray *a = array_of(h);
    mapping_stream *s = stream == Py_None ? NULL : PyLong_AsVoidPtr(stream);
    Py_buffer view = {0};
    if (!a || PyErr_Occurred() ||
        (out != Py_None && PyObject_GetBuffer(out, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0))
        return NULL;
    if (view.obj && (size_t)view.len != a->rows * a->row_bytes) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "gather: the output has %zd bytes, not %zu", view.len,
                            a->rows * a->row_bytes);
    }
    PyObject *r;
    WAITING(r, a, mapping_mpi_gather(s, a, view.buf, root));
    let_go(a, &view);
    return r;
}

static PyObject *m_set_delta(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *h;
    int on;
    if (!PyArg_ParseTuple(args, "Op", &h, &on))
        return NULL;
    mapping_mpi_darray *a = array_of(h);
    if (!a)
        return NULL;
    PyObject *r;
    WAITING(r, a, mapping_mpi_darray_set_delta(a, on));
    return r;
}

static PyObject *m_stats(PyObject *self, PyObject *h)
{
    (void)self;
    mapping_mpi_darray *a = array_of(h);
    mapping_mpi_darray_stats s;
    if (!a || mapping_mpi_darray_get_stats(a, &s) != MAPPING_OK)
        return NULL;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:O}", "exchanges", (unsigned long long)s.exchanges, "mpi_bytes_sent",
                         (unsigned long long)s.mpi_bytes_sent, "mpi_bytes_received",
                         (unsigned long long)s.mpi_bytes_received, "delta_bytes_saved",
                         (unsigned long long)s.delta_bytes_saved, "delta", a->delta.on ? Py_True : Py_False);
}

/* notify(handle, why): tells the other ranks this one failed. */
static PyObject *m_notify(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *h;
    const char *why;
    if (!PyArg_ParseTuple(args, "Os", &h, &why))
        return NULL;
    mapping_mpi_darray *a = array_of(h);
    if (!a)
        return NULL;
    mapping_status st = mapping_mpi_darray_notify_failure(a, why);
    return st == MAPPING_OK ? Py_NewRef(Py_None) : raise_status(st);
}

/* peer_failed(handle) -> None or (rank, why) */
static PyObject *m_peer_failed(PyObject *self, PyObject *h)
{
    (void)self;
    mapping_mpi_darray *a = array_of(h);
    if (!a)
        return NULL;
    int rank = -1;
    char why[256] = "";
    if (!mapping_mpi_darray_peer_failed(a, &rank, why, sizeof why))
        Py_RETURN_NONE;
    return Py_BuildValue("(is)", rank, why);
}

/* bench_exchange(handle, stream or None) -> seconds of one
 * mapping_mpi_halo_exchange and the stream's synchronize, timed in C: the C
 * add-on's own figure for python/bench_mpi.py. */
static PyObject *m_bench_exchange(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *h, *stream;
    if (!PyArg_ParseTuple(args, "OO", &h, &stream))
        return NULL;
    mapping_mpi_darray *a = array_of(h);
    mapping_stream *s = stream == Py_None ? NULL : PyLong_AsVoidPtr(stream);
    if (!a || PyErr_Occurred())
        return NULL;
    mapping_status st;
    double t;
    Py_BEGIN_ALLOW_THREADS
    double t0 = MPI_Wtime();
    st = mapping_mpi_halo_exchange(s, a);
    if (st == MAPPING_OK && s)
        st = mapping_stream_synchronize(s);
    t = MPI_Wtime() - t0;
    Py_END_ALLOW_THREADS
    return st == MAPPING_OK ? PyFloat_FromDouble(t) : raise_status(st);
}

static PyMethodDef methods[] = {
    {"set_errors", m_set_errors, METH_VARARGS, "(Error, {status: class}, PeerError, WaitTimeout)"},
    {"set_timeout", m_set_timeout, METH_O, "seconds a collective call waits for the others (0: for ever)"},
    {"abi", m_abi, METH_NOARGS, "the MPI this module was built with and runs on"},
    {"local_rank", m_local_rank, METH_O, "the rank within the node"},
    {"create", m_create, METH_VARARGS, "(comm, rows, cols, element_bytes, halo, device) -> handle"},
    {"destroy", m_destroy, METH_VARARGS, "(handle, collective)"},
    {"info", m_info, METH_O, "the block's placement"},
    {"exchange", (PyCFunction)(void (*)(void))m_exchange, METH_FASTCALL, "(handle, stream)"},
    {"scatter", m_scatter, METH_VARARGS, "(handle, global or None, root)"},
    {"gather", m_gather, METH_VARARGS, "(handle, stream, out or None, root)"},
    {"set_delta", m_set_delta, METH_VARARGS, "(handle, on)"},
    {"stats", m_stats, METH_O, "the array's exchange statistics"},
    {"notify", m_notify, METH_VARARGS, "(handle, why)"},
    {"peer_failed", m_peer_failed, METH_O, "None or (rank, why)"},
    {"bench_exchange", m_bench_exchange, METH_VARARGS, "(handle, stream) -> seconds"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mapping._mpi",
                                    "libmapping_mpi for mapping.mpi (see mapping/mpi.py)", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mpi(void)
{
    mapping_mpi_set_progress(progress, NULL);
    return PyModule_Create(&module);
}
