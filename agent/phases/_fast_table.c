/* JobTable._apply in C: one validated message applied to the job table's state.
 *
 * The state stays where agent/phases/jobs.py keeps it, in the same Python objects (the jobs'
 * slots, their lists, dicts and deques): this code only changes it the way _apply does, step by
 * step, in the same order, so everything else (views, GPU attribution, expiry, `teye profile`)
 * reads it unchanged.  _apply stays the specification: tests/phases/test_fast_table.py applies
 * generated message sequences through both and compares every field of the resulting state.
 *
 * What stays in Python, called from here: creating a job (JobTable._new_job), a ring slot other
 * than the current one (_Ring.slot), resolving a process's GPUs (attribution.resolve_gpus) and
 * starting to sample a data_wait sender (probe.track).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_fast_table.h"
#include <structmember.h>

#define NP 7
#define MAX_KINDS 8
#define MAX_BUCKETS 64

static PyObject *phases_tuple, *resolve_gpus, *accepted, *job_limit, *step_name;
static PyObject *deque_append, *odict_move_to_end;  /* the unbound methods, called without binding */
static PyTypeObject *pending_type;
static long long open_per_pid, max_pids, data_wait, step_key, in_step_key;
static int nkinds;
static int kind_order[MAX_KINDS][NP];    /* per IN_KINDS entry: its phase indices, in its order */
static int kind_len[MAX_KINDS];
static double buckets[MAX_BUCKETS];
static Py_ssize_t nbuckets;
static int table_ready;

/* attribute and method names, interned once */
static PyObject *s_jobs, *s_move_to_end, *s_new_job, *s_last_ns, *s_pids, *s_open, *s_ctx, *s_gpu_pids,
    *s_known_gpus, *s_ring, *s_recorded, *s_probe, *s_phase_s, *s_width, *s_cur_b, *s_cur_i, *s_slot, *s_phase,
    *s_waits, *s_label, *s_steps, *s_samples, *s_hist, *s_hist_sum, *s_step_ns, *s_in_step, *s_pending,
    *s_popleft, *s_append, *s_extend, *s_maxlen, *s_attributed, *s_overflow, *s_track,
    *s_limits, *s_clock, *s_lock, *s_results, *s_acquire, *s_release, *s_tracked, *s_uid, *s_retrack;

static int intern(PyObject **slot, const char *name)
{
    if (*slot == NULL)
        *slot = PyUnicode_InternFromString(name);
    return *slot == NULL ? -1 : 0;
}

static int intern_all(void)
{
    return intern(&s_jobs, "_jobs") | intern(&s_move_to_end, "move_to_end") | intern(&s_new_job, "_new_job") |
           intern(&s_last_ns, "last_ns") | intern(&s_pids, "pids") | intern(&s_open, "open") |
           intern(&s_ctx, "ctx") | intern(&s_gpu_pids, "gpu_pids") | intern(&s_known_gpus, "_known_gpus") |
           intern(&s_ring, "ring") | intern(&s_recorded, "recorded") | intern(&s_probe, "probe") |
           intern(&s_phase_s, "phase_s") | intern(&s_width, "width") | intern(&s_cur_b, "cur_b") |
           intern(&s_cur_i, "cur_i") | intern(&s_slot, "slot") | intern(&s_phase, "phase") |
           intern(&s_waits, "waits") | intern(&s_label, "label") | intern(&s_steps, "steps") |
           intern(&s_samples, "samples") | intern(&s_hist, "hist") | intern(&s_hist_sum, "hist_sum") |
           intern(&s_step_ns, "step_ns") | intern(&s_in_step, "in_step") | intern(&s_pending, "pending") |
           intern(&s_popleft, "popleft") | intern(&s_append, "append") | intern(&s_extend, "extend") |
           intern(&s_maxlen, "maxlen") | intern(&s_attributed, "attributed") |
           intern(&s_overflow, "overflow") | intern(&s_track, "track") |
           intern(&s_limits, "limits") | intern(&s_clock, "clock") | intern(&s_lock, "_lock") |
           intern(&s_results, "results") | intern(&s_acquire, "acquire") | intern(&s_release, "release") |
           intern(&s_tracked, "_pids") | intern(&s_uid, "uid") | intern(&s_retrack, "RETRACK_NS");
}

/* ---- the slots of jobs._Job and jobs._Ring, read at their offsets ---- */

enum { J_LAST_NS, J_PIDS, J_OPEN, J_RING, J_PHASE_S, J_WAITS, J_LABEL, J_STEPS, J_SAMPLES, J_HIST, J_HIST_SUM,
       J_PENDING, NJ };
enum { R_WIDTH, R_CUR_B, R_CUR_I, R_PHASE, R_STEP_NS, R_STEPS, R_IN_STEP, NR };
static PyObject **const job_names[NJ] = {&s_last_ns, &s_pids, &s_open, &s_ring, &s_phase_s, &s_waits, &s_label,
                                         &s_steps, &s_samples, &s_hist, &s_hist_sum, &s_pending};
static PyObject **const ring_names[NR] = {&s_width, &s_cur_b, &s_cur_i, &s_phase, &s_step_ns, &s_steps, &s_in_step};
static PyTypeObject *job_type, *ring_type;
static Py_ssize_t job_off[NJ], ring_off[NR];

typedef struct {
    PyTypeObject **type;
    const Py_ssize_t *off;
    PyObject **const *names;
} Layout;

static const Layout JOB = {&job_type, job_off, job_names}, RING = {&ring_type, ring_off, ring_names};

/* The offset of a writable object slot (a __slots__ entry) of type t. */
static int slot_offset(PyTypeObject *t, PyObject *name, Py_ssize_t *off)
{
    PyObject *d = PyObject_GetAttr((PyObject *)t, name);
    if (d == NULL)
        return -1;
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
             !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
    if (ok)
        *off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok)
        PyErr_Format(PyExc_TypeError, "%s.%U is not a writable __slots__ entry", t->tp_name, name);
    return ok ? 0 : -1;
}

/* o.<slot i> (new reference): straight from the slot when o is exactly the layout's type */
static PyObject *get(PyObject *o, const Layout *l, int i)
{
    if (Py_TYPE(o) == *l->type) {
        PyObject *v = *(PyObject **)((char *)o + l->off[i]);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, *l->names[i]);
}

static int set(PyObject *o, const Layout *l, int i, PyObject *v)
{
    if (Py_TYPE(o) == *l->type) {
        Py_INCREF(v);
        Py_XSETREF(*(PyObject **)((char *)o + l->off[i]), v);
        return 0;
    }
    return PyObject_SetAttr(o, *l->names[i], v);
}

/* o.<slot i> += delta */
static int add_slot(PyObject *o, const Layout *l, int i, PyObject *delta)
{
    PyObject *old = get(o, l, i);
    if (old == NULL)
        return -1;
    PyObject *sum = PyNumber_Add(old, delta);
    Py_DECREF(old);
    if (sum == NULL)
        return -1;
    int r = set(o, l, i, sum);
    Py_DECREF(sum);
    return r;
}

/* o.name, or NULL without an exception where o has no such attribute */
static PyObject *attr_or_null(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return v;
}

/* Whether probe.track(pid, uid, now) would do anything: procstat.InputProbe.track's first test,
 * made here on the probe's own state so that the usual call (a process tracked a moment ago)
 * costs no trip through the interpreter.  0: it would return at once; 1: call it (also for a
 * probe without that state, e.g. a test double); -1: error. */
/* The probe's per-pid record (procstat._Tracked) is read at its slots' offsets: the type is learnt
 * from the first record seen (any other type is read by name). */
enum { T_UID, T_LAST_NS, NT };
static PyObject **const tracked_names[NT] = {&s_uid, &s_last_ns};
static PyTypeObject *tracked_type;
static Py_ssize_t tracked_off[NT];

static void learn_tracked(PyTypeObject *t)
{
    Py_ssize_t off[NT];
    for (int i = 0; i < NT; i++)
        if (slot_offset(t, *tracked_names[i], &off[i]) < 0) {
            PyErr_Clear();  /* not a __slots__ record: read it by name */
            return;
        }
    memcpy(tracked_off, off, sizeof off);
    Py_INCREF(t);
    tracked_type = t;
}

static PyObject *tracked_get(PyObject *t, int i)
{
    if (Py_TYPE(t) == tracked_type) {
        PyObject *v = *(PyObject **)((char *)t + tracked_off[i]);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return attr_or_null(t, *tracked_names[i]);
}

static int track_due(const Refs *r, PyObject *pid, PyObject *uid, PyObject *nowobj)
{
    PyObject *t = NULL, *tuid = NULL, *last = NULL;
    int due = 1;
    if (r->probe_pids == NULL || r->retrack == NULL)
        goto out;
    t = PyDict_GetItemWithError(r->probe_pids, pid);  /* borrowed */
    if (t == NULL)
        goto out;
    Py_INCREF(t);
    if (tracked_type == NULL)
        learn_tracked(Py_TYPE(t));
    if ((tuid = tracked_get(t, T_UID)) == NULL || (last = tracked_get(t, T_LAST_NS)) == NULL)
        goto out;
    int same = PyObject_RichCompareBool(tuid, uid, Py_EQ);
    if (same <= 0) {
        due = same < 0 ? -1 : 1;
        goto out;
    }
    long long now, then, window;
    int o1 = 0, o2 = 0, o3 = 0;
    now = PyLong_Check(nowobj) ? PyLong_AsLongLongAndOverflow(nowobj, &o1) : (o1 = 1, 0);
    then = PyLong_Check(last) ? PyLong_AsLongLongAndOverflow(last, &o2) : (o2 = 1, 0);
    window = PyLong_Check(r->retrack) ? PyLong_AsLongLongAndOverflow(r->retrack, &o3) : (o3 = 1, 0);
    if (PyErr_Occurred())
        due = -1;
    else if (!(o1 | o2 | o3)) { /* anything else (not ints, past 64 bits): let track() decide */
        __int128 age = (__int128)now - then;
        due = !(0 <= age && age < window);
    }
out:
    if (due > 0 && PyErr_Occurred())
        due = -1;
    Py_XDECREF(t);
    Py_XDECREF(tuid);
    Py_XDECREF(last);
    return due;
}

/* ---- Refs (_fast_table.h) ---- */

static int refs_fill_gpus(Refs *r)
{
    r->known_gpus = PyObject_GetAttr(r->tbl, s_known_gpus);
    r->gpu_pids = r->known_gpus ? PyObject_GetAttr(r->ctx, s_gpu_pids) : NULL;
    return r->gpu_pids != NULL ? 0 : -1;
}

static void refs_clear_gpus(Refs *r)
{
    Py_CLEAR(r->known_gpus);
    Py_CLEAR(r->gpu_pids);
}

static void refs_clear(Refs *r)
{
    Py_CLEAR(r->ctx);
    Py_CLEAR(r->jobs);
    Py_CLEAR(r->recorded);
    Py_CLEAR(r->probe);
    Py_CLEAR(r->probe_pids);
    Py_CLEAR(r->retrack);
    refs_clear_gpus(r);
}

/* Everything but the GPU maps; on error nothing is kept. */
static int refs_fill(Refs *r, PyObject *tbl)
{
    memset(r, 0, sizeof *r);
    r->tbl = tbl;
    if ((r->ctx = PyObject_GetAttr(tbl, s_ctx)) == NULL || (r->jobs = PyObject_GetAttr(tbl, s_jobs)) == NULL ||
        (r->recorded = PyObject_GetAttr(tbl, s_recorded)) == NULL || (r->probe = PyObject_GetAttr(tbl, s_probe)) == NULL)
        goto fail;
    if (!PyDict_Check(r->jobs)) {
        PyErr_SetString(PyExc_TypeError, "table._jobs must be a dict");
        goto fail;
    }
    if (r->probe != Py_None) {  /* track_due's view of the probe: without it, track() decides */
        r->probe_pids = attr_or_null(r->probe, s_tracked);
        if (r->probe_pids != NULL && !PyDict_Check(r->probe_pids))
            Py_CLEAR(r->probe_pids);
        if (!PyErr_Occurred())
            r->retrack = attr_or_null(r->probe, s_retrack);
        if (PyErr_Occurred())
            goto fail;
    }
    return 0;
fail:
    refs_clear(r);
    return -1;
}

/* ---- small helpers over Python objects (each returns -1 with an exception set on failure) ---- */

static int call_append(PyObject *seq, PyObject *item)
{
    if (PyList_CheckExact(seq))
        return PyList_Append(seq, item);
    PyObject *args[2] = {seq, item};
    PyObject *r = Py_IS_TYPE(seq, (PyTypeObject *)PyDescr_TYPE(deque_append))
                      ? PyObject_Vectorcall(deque_append, args, 2, NULL)
                      : PyObject_CallMethodOneArg(seq, s_append, item);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* seq[i] += delta (any numbers) */
static int add_item(PyObject *seq, Py_ssize_t i, PyObject *delta)
{
    PyObject *old = PySequence_GetItem(seq, i);
    if (old == NULL)
        return -1;
    PyObject *sum = PyNumber_Add(old, delta);
    Py_DECREF(old);
    if (sum == NULL)
        return -1;
    int r = PySequence_SetItem(seq, i, sum);
    Py_DECREF(sum);
    return r;
}

/* seq[i] += delta: in C where seq is a list and seq[i] an int that stays within 64 bits (the usual
 * case: ns sums), else through add_item() */
static int add_item_ll(PyObject *seq, Py_ssize_t i, long long delta)
{
    if (PyList_CheckExact(seq) && i >= 0 && i < PyList_GET_SIZE(seq) && PyLong_CheckExact(PyList_GET_ITEM(seq, i))) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(seq, i), &overflow), sum;
        if (!overflow && !__builtin_add_overflow(v, delta, &sum)) {
            PyObject *n = PyLong_FromLongLong(sum);
            return n == NULL ? -1 : PyList_SetItem(seq, i, n);  /* steals n, drops the old value */
        }
    }
    PyObject *d = PyLong_FromLongLong(delta);
    if (d == NULL)
        return -1;
    int r = add_item(seq, i, d);
    Py_DECREF(d);
    return r;
}

/* seq[i] += x, x a float (in C where seq is a list and seq[i] a float: the same IEEE sum) */
static int add_item_float(PyObject *seq, Py_ssize_t i, double x)
{
    if (PyList_CheckExact(seq) && i >= 0 && i < PyList_GET_SIZE(seq) && PyFloat_CheckExact(PyList_GET_ITEM(seq, i))) {
        PyObject *n = PyFloat_FromDouble(PyFloat_AS_DOUBLE(PyList_GET_ITEM(seq, i)) + x);
        return n == NULL ? -1 : PyList_SetItem(seq, i, n);
    }
    PyObject *d = PyFloat_FromDouble(x);
    if (d == NULL)
        return -1;
    int r = add_item(seq, i, d);
    Py_DECREF(d);
    return r;
}

/* seq[slot][i] += delta where slot is an int object */
static int add_row_item(PyObject *table, PyObject *slot, Py_ssize_t i, long long delta)
{
    PyObject *row = PyObject_GetItem(table, slot);
    if (row == NULL)
        return -1;
    int r = add_item_ll(row, i, delta);
    Py_DECREF(row);
    return r;
}

static int add_at_slot(PyObject *seq, PyObject *slot, long long delta)
{
    Py_ssize_t i = PyLong_AsSsize_t(slot);
    if (i == -1 && PyErr_Occurred())
        return -1;
    return add_item_ll(seq, i, delta);
}

static inline long long floordiv(long long a, long long b) /* b > 0 */
{
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* PyLong_AsLongLong() without its detour through a byte array for ints past 2**30 (every ns time) */
static int as_ll(PyObject *o, long long *out)
{
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "int too large to convert to a 64-bit integer");
        return -1;
    }
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int phase_index(PyObject *name)
{
    for (int i = 0; i < NP; i++)
        if (PyTuple_GET_ITEM(phases_tuple, i) == name)
            return i;
    for (int i = 0; i < NP; i++) {
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(phases_tuple, i), name, Py_EQ);
        if (eq != 0)
            return eq < 0 ? -1 : i;
    }
    PyErr_SetObject(PyExc_KeyError, name);
    return -1;
}

static PyObject *tuple3(PyObject *a, PyObject *b, PyObject *c)
{
    return PyTuple_Pack(3, a, b, c);
}

/* A Pending(key, s, e, gpus) with key = (k, key_e), built as tuple.__new__ would. */
static PyObject *pending(long long k, PyObject *key_e, PyObject *s, PyObject *e, PyObject *gpus)
{
    PyObject *kobj = PyLong_FromLongLong(k);
    if (kobj == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(2, kobj, key_e);
    Py_DECREF(kobj);
    if (key == NULL)
        return NULL;
    PyObject *p = pending_type->tp_alloc(pending_type, 4);
    if (p == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    Py_INCREF(s);
    Py_INCREF(e);
    Py_INCREF(gpus);
    PyTuple_SET_ITEM(p, 0, key);
    PyTuple_SET_ITEM(p, 1, s);
    PyTuple_SET_ITEM(p, 2, e);
    PyTuple_SET_ITEM(p, 3, gpus);
    return p;
}

/* A Pending((k, key_e), s, e, gpus) of a piece [s, e) in C integers (NULL on error). */
static PyObject *pending_ll(long long k, PyObject *key_e, long long s, long long e, PyObject *gpus)
{
    PyObject *so = PyLong_FromLongLong(s), *eo = PyLong_FromLongLong(e);
    PyObject *p = (so && eo) ? pending(k, key_e, so, eo, gpus) : NULL;
    Py_XDECREF(so);
    Py_XDECREF(eo);
    return p;
}

/* key[0] and key[1] of a queued Pending (borrowed) */
static int pending_key(PyObject *p, long long *k0, PyObject **k1)
{
    PyObject *key = PySequence_GetItem(p, 0);
    if (key == NULL)
        return -1;
    PyObject *a = PySequence_GetItem(key, 0);
    *k1 = a ? PySequence_GetItem(key, 1) : NULL;
    Py_DECREF(key);
    int r = (a == NULL || *k1 == NULL) ? -1 : as_ll(a, k0);
    Py_XDECREF(a);
    if (r < 0)
        Py_CLEAR(*k1);
    return r;
}

/* obj.attributed["overflow"] += 1 */
static int count_overflow(PyObject *tbl)
{
    PyObject *att = PyObject_GetAttr(tbl, s_attributed), *one = PyLong_FromLong(1);
    int bad = att == NULL || one == NULL;
    PyObject *cnt = bad ? NULL : PyObject_GetItem(att, s_overflow);
    PyObject *sum = cnt ? PyNumber_Add(cnt, one) : NULL;
    bad = sum == NULL || PyObject_SetItem(att, s_overflow, sum) < 0;
    Py_XDECREF(att);
    Py_XDECREF(one);
    Py_XDECREF(cnt);
    Py_XDECREF(sum);
    return bad ? -1 : 0;
}

/* JobTable._push_out: drop the oldest waiting interval unattributed; a step goes with its pieces. */
static int push_out(PyObject *tbl, PyObject *q)
{
    int r = -1;
    long long k0;
    PyObject *old = NULL, *old_k1 = NULL;
    if ((old = PyObject_CallMethodNoArgs(q, s_popleft)) == NULL || pending_key(old, &k0, &old_k1) < 0)
        goto done;
    if (k0 < in_step_key && count_overflow(tbl) < 0)
        goto done;
    if (k0 == step_key) {
        for (;;) {
            Py_ssize_t left = PyObject_Size(q);
            if (left < 0)
                goto done;
            if (left == 0)
                break;
            PyObject *head = PySequence_GetItem(q, 0), *h1 = NULL;
            long long h0;
            if (head == NULL)
                goto done;
            int got = pending_key(head, &h0, &h1);
            Py_DECREF(head);
            if (got < 0)
                goto done;
            int same = h0 >= in_step_key ? PyObject_RichCompareBool(h1, old_k1, Py_EQ) : 0;
            Py_DECREF(h1);
            if (same < 0)
                goto done;
            if (!same)
                break;
            PyObject *gone = PyObject_CallMethodNoArgs(q, s_popleft);
            if (gone == NULL)
                goto done;
            Py_DECREF(gone);
        }
    }
    r = 0;
done:
    Py_XDECREF(old);
    Py_XDECREF(old_k1);
    return r;
}

/* job.pending and its maxlen (-1: unbounded) */
static PyObject *pending_queue(PyObject *job, Py_ssize_t *maxlen)
{
    PyObject *q = get(job, &JOB, J_PENDING);
    if (q == NULL)
        return NULL;
    PyObject *m = PyObject_GetAttr(q, s_maxlen);
    if (m == NULL) {
        Py_DECREF(q);
        return NULL;
    }
    *maxlen = m == Py_None ? -1 : PyLong_AsSsize_t(m);
    Py_DECREF(m);
    if (*maxlen == -1 && PyErr_Occurred()) {
        Py_DECREF(q);
        return NULL;
    }
    return q;
}

/* JobTable._queue: append p (stolen) to job.pending, pushing the oldest out when full. */
static int queue(PyObject *tbl, PyObject *job, PyObject *p)
{
    Py_ssize_t maxlen, n;
    int r = -1;
    if (p == NULL)
        return -1;
    PyObject *q = pending_queue(job, &maxlen);
    if (q == NULL || (n = PyObject_Size(q)) < 0)
        goto done;
    if (n == maxlen && push_out(tbl, q) < 0)
        goto done;
    r = call_append(q, p);
done:
    Py_DECREF(p);
    Py_XDECREF(q);
    return r;
}

/* JobTable._queue_step: a step and its in-step pieces (the list group) enter the queue together. */
static int queue_step(PyObject *tbl, PyObject *job, PyObject *group)
{
    Py_ssize_t maxlen, n, g = PyList_GET_SIZE(group);
    PyObject *q = pending_queue(job, &maxlen);
    if (q == NULL)
        return -1;
    int r = -1;
    if (maxlen >= 0 && g > maxlen) {
        r = count_overflow(tbl);
        goto done;
    }
    for (;;) {
        if ((n = PyObject_Size(q)) < 0)
            goto done;
        if (maxlen < 0 || n + g <= maxlen)
            break;
        if (push_out(tbl, q) < 0)
            goto done;
    }
    PyObject *x = PyObject_CallMethodOneArg(q, s_extend, group);
    if (x == NULL)
        goto done;
    Py_DECREF(x);
    r = 0;
done:
    Py_DECREF(q);
    return r;
}

/* ---- the open phases of a process, closed by its steps ---- */

typedef struct {
    int k;
    long long a, b;
} Piece;

typedef struct {
    Piece *v;      /* the open phases (index, s, e) as read from the deque */
    Py_ssize_t n;
} Open;

static int read_open(PyObject *opened, Open *o)
{
    o->v = NULL;
    o->n = 0;
    Py_ssize_t n = PyList_GET_SIZE(opened);
    o->v = PyMem_Malloc(sizeof(Piece) * (n ? n : 1));
    if (o->v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *t = PyList_GET_ITEM(opened, j);
        long long k;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 || as_ll(PyTuple_GET_ITEM(t, 0), &k) < 0 ||
            as_ll(PyTuple_GET_ITEM(t, 1), &o->v[j].a) < 0 || as_ll(PyTuple_GET_ITEM(t, 2), &o->v[j].b) < 0 ||
            k < 0 || k >= NP) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "an open phase is not (index, start_ns, end_ns)");
            return -1;
        }
        o->v[j].k = (int)k;
    }
    o->n = n;
    return 0;
}

/* JobTable._forget_closed: keep only the open phases that end after e (o: the list as read). */
static int forget(PyObject *opened, const Open *o, long long e)
{
    Py_ssize_t w = 0;
    for (Py_ssize_t j = 0; j < o->n; j++) {
        if (o->v[j].b > e) {
            PyObject *t = PyList_GET_ITEM(opened, j);
            Py_INCREF(t);
            PyList_SetItem(opened, w++, t);  /* w <= j: the item it replaces was kept earlier or dropped */
        }
    }
    return PyList_SetSlice(opened, w, PyList_GET_SIZE(opened), NULL);
}

/* JobTable._close_step_sums: 1 and sums[k] (with present mask) when each index occurs once inside
 * [s, e); 0 when one repeats (nothing changed); -1 on error. */
static int close_step_sums(PyObject *opened, const Open *o, long long s, long long e, long long sums[NP],
                           int order[NP], int *norder)
{
    unsigned seen = 0;
    int straddles = 0;
    *norder = 0;
    for (Py_ssize_t j = 0; j < o->n; j++) {
        long long a = o->v[j].a, b = o->v[j].b;
        if (b > e) {
            straddles = 1;
            b = e;
        }
        if (a < s)
            a = s;
        if (b > a) {
            unsigned bit = 1u << o->v[j].k;
            if (seen & bit)
                return 0;
            seen |= bit;
            sums[o->v[j].k] = b - a;
            order[(*norder)++] = o->v[j].k;
        }
    }
    if (straddles)
        return forget(opened, o, e) < 0 ? -1 : 1;
    return PyList_SetSlice(opened, 0, PyList_GET_SIZE(opened), NULL) < 0 ? -1 : 1;
}

static int cmp_piece(const void *x, const void *y)
{
    const Piece *p = x, *q = y;
    if (p->a != q->a)
        return p->a < q->a ? -1 : 1;
    if (p->b != q->b)
        return p->b < q->b ? -1 : 1;
    return 0;
}

/* attribution.merged over v[0..n): sorts v and merges it in place; returns the new length. */
static Py_ssize_t merge(Piece *v, Py_ssize_t n)
{
    qsort(v, n, sizeof(Piece), cmp_piece);
    Py_ssize_t m = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (v[j].b <= v[j].a)
            continue;
        if (m && v[j].a <= v[m - 1].b) {
            if (v[j].b > v[m - 1].b)
                v[m - 1].b = v[j].b;
        } else {
            v[m++] = v[j];
        }
    }
    return m;
}

/* attribution.clip_to_step: per phase index, its merged pieces inside [s, e), written to out
 * (grouped by index in first-occurrence order: order[], start[], count[]). */
typedef struct {
    Piece *v;
    unsigned mask;     /* the phase indices present */
    int order[NP], norder;
    Py_ssize_t start[NP], count[NP];
} Pieces;

static int clip_to_step(const Open *o, long long s, long long e, Pieces *p)
{
    p->norder = 0;
    p->mask = 0;
    p->v = PyMem_Malloc(sizeof(Piece) * (o->n ? o->n : 1));
    if (p->v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t per[NP] = {0};
    int first[NP];
    for (int k = 0; k < NP; k++)
        first[k] = -1;
    for (Py_ssize_t j = 0; j < o->n; j++) {
        long long a = o->v[j].a < s ? s : o->v[j].a, b = o->v[j].b > e ? e : o->v[j].b;
        int k = o->v[j].k;
        if (b > a) {
            if (first[k] < 0) {
                first[k] = p->norder;
                p->mask |= 1u << k;
                p->order[p->norder++] = k;
            }
            per[k]++;
        }
    }
    Py_ssize_t at = 0;
    for (int x = 0; x < p->norder; x++) {
        int k = p->order[x];
        p->start[k] = at;
        p->count[k] = 0;
        at += per[k];
    }
    for (Py_ssize_t j = 0; j < o->n; j++) {
        long long a = o->v[j].a < s ? s : o->v[j].a, b = o->v[j].b > e ? e : o->v[j].b;
        int k = o->v[j].k;
        if (b > a) {
            Piece *q = &p->v[p->start[k] + p->count[k]++];
            q->k = k;
            q->a = a;
            q->b = b;
        }
    }
    for (int x = 0; x < p->norder; x++) {
        int k = p->order[x];
        if (p->count[k] > 1)
            p->count[k] = merge(p->v + p->start[k], p->count[k]);
    }
    return 0;
}

/* ---- the message ---- */

typedef struct {
    const Refs *refs;
    PyObject *job, *pid, *uid, *nowobj;
    long long now;
    PyObject *opened;  /* the process's deque of open phases, or NULL */
    PyObject *gpus;    /* a non-empty tuple of GPU labels, or NULL */
    PyObject *ring, *phase_s, *label;
    PyObject *cur_slot;
    long long width, cur;
} Ctx;

/* ring.slot(e, now) unless e falls in the current slot (new reference; Py_None: outside the window) */
static PyObject *slot_of(Ctx *c, PyObject *eobj, long long e)
{
    if (floordiv(e, c->width) >= c->cur) {
        Py_INCREF(c->cur_slot);
        return c->cur_slot;
    }
    return PyObject_CallMethodObjArgs(c->ring, s_slot, eobj, c->nowobj, NULL);
}

static int record(Ctx *c, PyObject *what, PyObject *s, PyObject *e)
{
    PyObject *t = PyTuple_Pack(4, c->label, what, s, e);
    if (t == NULL)
        return -1;
    int r = call_append(c->refs->recorded, t);
    Py_DECREF(t);
    return r;
}

static int apply_phase(Ctx *c, PyObject *rec, int *waited)
{
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 3) {
        PyErr_SetString(PyExc_TypeError, "a phase record is not (phase, start_ns, end_ns)");
        return -1;
    }
    PyObject *phase = PyTuple_GET_ITEM(rec, 0), *so = PyTuple_GET_ITEM(rec, 1), *eo = PyTuple_GET_ITEM(rec, 2);
    long long s, e;
    int i = phase_index(phase);
    if (i < 0 || as_ll(so, &s) < 0 || as_ll(eo, &e) < 0)
        return -1;
    if (add_item_float(c->phase_s, i, (double)(e - s) / 1e9) < 0)
        return -1;
    PyObject *io = PyLong_FromLong(i);
    if (io == NULL)
        return -1;
    if (c->opened != NULL) {
        /* at most OPEN_PER_PID phases wait for their step: the oldest goes */
        if (PyList_GET_SIZE(c->opened) >= open_per_pid && PyList_SetSlice(c->opened, 0, 1, NULL) < 0) {
            Py_DECREF(io);
            return -1;
        }
        PyObject *t = tuple3(io, so, eo);
        int r = t == NULL ? -1 : PyList_Append(c->opened, t);
        Py_XDECREF(t);
        if (r < 0) {
            Py_DECREF(io);
            return -1;
        }
    }
    Py_DECREF(io);
    if (i == data_wait && c->refs->probe != Py_None && e > s) {
        PyObject *waits = get(c->job, &JOB, J_WAITS);
        PyObject *t = waits ? tuple3(c->pid, so, eo) : NULL;
        int r = t == NULL ? -1 : call_append(waits, t);
        Py_XDECREF(waits);
        Py_XDECREF(t);
        if (r < 0)
            return -1;
        *waited = 1;
    }
    PyObject *slot = slot_of(c, eo, e);
    if (slot == NULL)
        return -1;
    if (slot != Py_None) {
        PyObject *rows = get(c->ring, &RING, R_PHASE);
        int r = rows == NULL ? -1 : add_row_item(rows, slot, i, e - s);
        Py_XDECREF(rows);
        if (r < 0) {
            Py_DECREF(slot);
            return -1;
        }
    }
    Py_DECREF(slot);
    if (c->gpus != NULL && queue(c->refs->tbl, c->job, pending(i, eo, so, eo, c->gpus)) < 0)
        return -1;
    if (c->refs->recorded != Py_None && record(c, phase, so, eo) < 0)
        return -1;
    return 0;
}

static int bisect_left(double d)
{
    int lo = 0, hi = (int)nbuckets;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (buckets[mid] < d)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int apply_step(Ctx *c, PyObject *rec)
{
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 3) {
        PyErr_SetString(PyExc_TypeError, "a step record is not (start_ns, end_ns, samples)");
        return -1;
    }
    PyObject *so = PyTuple_GET_ITEM(rec, 0), *eo = PyTuple_GET_ITEM(rec, 1), *samples = PyTuple_GET_ITEM(rec, 2);
    long long s, e;
    if (as_ll(so, &s) < 0 || as_ll(eo, &e) < 0)
        return -1;
    double d = (double)(e - s) / 1e9;
    long long sums[NP];
    int order[NP], norder = 0, have = 0, r = -1;
    Open o = {NULL, 0};
    Pieces p = {NULL};
    PyObject *slot = NULL, *rows = NULL, *row = NULL, *v = NULL, *group = NULL;

    Py_ssize_t nopen = c->opened == NULL ? 0 : PyList_GET_SIZE(c->opened);
    if (nopen > 0 && read_open(c->opened, &o) < 0)
        goto done;
    if (c->gpus == NULL && nopen > 0) {
        have = close_step_sums(c->opened, &o, s, e, sums, order, &norder);
        if (have < 0)
            goto done;
    }
    if (!have) {  /* JobTable._close_step (or no open phases: no pieces) */
        if (nopen > 0) {
            if (clip_to_step(&o, s, e, &p) < 0 || forget(c->opened, &o, e) < 0)
                goto done;
        }
        norder = p.norder;
        for (int x = 0; x < p.norder; x++) {
            int k = p.order[x];
            long long sum = 0;
            for (Py_ssize_t j = 0; j < p.count[k]; j++)
                sum += p.v[p.start[k] + j].b - p.v[p.start[k] + j].a;
            sums[k] = sum;
            order[x] = k;
        }
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        goto done;
    int bad = add_slot(c->job, &JOB, J_STEPS, one) < 0 || add_slot(c->job, &JOB, J_SAMPLES, samples) < 0;
    Py_DECREF(one);
    if (bad)
        goto done;
    if ((v = PyFloat_FromDouble(d)) == NULL || add_slot(c->job, &JOB, J_HIST_SUM, v) < 0)
        goto done;
    if ((rows = get(c->job, &JOB, J_HIST)) == NULL || add_item_ll(rows, bisect_left(d), 1) < 0)
        goto done;
    Py_CLEAR(rows);
    if ((slot = slot_of(c, eo, e)) == NULL)
        goto done;
    if (slot != Py_None) {
        if ((rows = get(c->ring, &RING, R_STEP_NS)) == NULL || add_at_slot(rows, slot, e - s) < 0)
            goto done;
        Py_CLEAR(rows);
        if ((rows = get(c->ring, &RING, R_STEPS)) == NULL || add_at_slot(rows, slot, 1) < 0)
            goto done;
        Py_CLEAR(rows);
        if ((rows = get(c->ring, &RING, R_IN_STEP)) == NULL || (row = PyObject_GetItem(rows, slot)) == NULL)
            goto done;
        for (int x = 0; x < norder; x++)
            if (add_item_ll(row, order[x], sums[order[x]]) < 0)
                goto done;
    }
    if (c->gpus != NULL) {
        /* the step, then per IN_KINDS entry the merged pieces of its phases, queued together */
        if ((group = PyList_New(0)) == NULL)
            goto done;
        PyObject *sp = pending(step_key, eo, so, eo, c->gpus);
        int bad = sp == NULL || PyList_Append(group, sp) < 0;
        Py_XDECREF(sp);
        if (bad)
            goto done;
        for (int n = 0; n < nkinds; n++) {
            Py_ssize_t total = 0;
            for (int x = 0; x < kind_len[n]; x++)
                if (p.mask & (1u << kind_order[n][x]))
                    total += p.count[kind_order[n][x]];
            if (total == 0)
                continue;
            Piece *u = PyMem_Malloc(sizeof(Piece) * total);
            if (u == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            Py_ssize_t m = 0;
            for (int x = 0; x < kind_len[n]; x++) {
                int k = kind_order[n][x];
                if (p.mask & (1u << k))
                    for (Py_ssize_t j = 0; j < p.count[k]; j++)
                        u[m++] = p.v[p.start[k] + j];
            }
            m = merge(u, m);
            for (Py_ssize_t j = 0; j < m; j++) {
                PyObject *pp = pending_ll(in_step_key + n, eo, u[j].a, u[j].b, c->gpus);
                bad = pp == NULL || PyList_Append(group, pp) < 0;
                Py_XDECREF(pp);
                if (bad) {
                    PyMem_Free(u);
                    goto done;
                }
            }
            PyMem_Free(u);
        }
        if (queue_step(c->refs->tbl, c->job, group) < 0)
            goto done;
    }
    if (c->refs->recorded != Py_None && record(c, step_name, so, eo) < 0)
        goto done;
    r = 0;
done:
    PyMem_Free(o.v);
    PyMem_Free(p.v);
    Py_XDECREF(slot);
    Py_XDECREF(rows);
    Py_XDECREF(row);
    Py_XDECREF(v);
    Py_XDECREF(group);
    return r;
}

/* pids[pid] = max(pids.get(pid, 0), dropped) */
static int note_pid(PyObject *pids, PyObject *pid, PyObject *dropped)
{
    PyObject *old = PyDict_GetItemWithError(pids, pid);  /* borrowed */
    if (old == NULL && PyErr_Occurred())
        return -1;
    PyObject *keep = dropped;
    if (old != NULL) {
        int gt = PyObject_RichCompareBool(dropped, old, Py_GT);
        if (gt < 0)
            return -1;
        keep = gt ? dropped : old;
    } else {
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL)
            return -1;
        int gt = PyObject_RichCompareBool(dropped, zero, Py_GT);
        if (gt <= 0) {
            int r = gt < 0 ? -1 : PyDict_SetItem(pids, pid, zero);
            Py_DECREF(zero);
            return r;
        }
        Py_DECREF(zero);
    }
    Py_INCREF(keep);
    int r = PyDict_SetItem(pids, pid, keep);
    Py_DECREF(keep);
    return r;
}

/* gpus = attribution.resolve_gpus(...) when the message has records and the process is known to use
 * GPUs (NVML's process list, or CUDA_VISIBLE_DEVICES naming sampled GPUs); NULL in c->gpus when none. */
static int find_gpus(Ctx *c, PyObject *msg)
{
    c->gpus = NULL;
    if (PyObject_Length(PyTuple_GET_ITEM(msg, 1)) == 0 && PyObject_Length(PyTuple_GET_ITEM(msg, 2)) == 0)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *cvd = PyTuple_GET_ITEM(msg, 3), *known = c->refs->known_gpus, *gpu_pids = c->refs->gpu_pids;
    int want = 0;
    int t = PyObject_IsTrue(cvd);
    if (t < 0)
        return -1;
    if (t) {
        t = PyObject_IsTrue(known);
        if (t < 0)
            return -1;
        want = t;
    }
    if (!want) {
        t = PySequence_Contains(gpu_pids, c->pid);
        if (t < 0)
            return -1;
        want = t;
    }
    if (want) {
        PyObject *g = PyObject_CallFunctionObjArgs(resolve_gpus, c->pid, cvd, gpu_pids, known, NULL);
        if (g == NULL)
            return -1;
        t = PyObject_IsTrue(g);
        if (t <= 0) {
            Py_DECREF(g);
            if (t < 0)
                return -1;
        } else {
            c->gpus = g;
        }
    }
    return 0;
}

static PyObject *apply_msg(const Refs *refs, PyObject *msg, PyObject *pid, PyObject *uid, PyObject *nowobj)
{
    Ctx c = {refs, NULL, pid, uid, nowobj, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    PyObject *tbl = refs->tbl, *jobs = refs->jobs;
    PyObject *result = NULL, *key = NULL, *pids = NULL, *open = NULL, *width = NULL, *cur_b = NULL;
    PyObject *phases = NULL, *steps = NULL;
    int waited = 0;
    if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) != 5) {
        PyErr_SetString(PyExc_TypeError, "apply(): msg must be a protocol.Message");
        return NULL;
    }
    if (as_ll(nowobj, &c.now) < 0)
        return NULL;
    if ((key = PyTuple_Pack(2, uid, PyTuple_GET_ITEM(msg, 0))) == NULL)
        goto done;
    c.job = PyDict_GetItemWithError(jobs, key);
    if (c.job == NULL) {
        if (PyErr_Occurred())
            goto done;
        c.job = PyObject_CallMethodObjArgs(tbl, s_new_job, key, pid, uid, nowobj, NULL);
        if (c.job == NULL)
            goto done;
        if (c.job == Py_None) {
            Py_INCREF(job_limit);
            result = job_limit;
            goto done;
        }
    } else {
        Py_INCREF(c.job);
        PyObject *args[2] = {jobs, key};
        PyObject *x = PyObject_Vectorcall(odict_move_to_end, args, 2, NULL);
        if (x == NULL)
            goto done;
        Py_DECREF(x);
    }
    if (set(c.job, &JOB, J_LAST_NS, nowobj) < 0 || (pids = get(c.job, &JOB, J_PIDS)) == NULL)
        goto done;
    if (!PyDict_Check(pids)) {
        PyErr_SetString(PyExc_TypeError, "job.pids must be a dict");
        goto done;
    }
    int known = PyDict_Contains(pids, pid);
    if (known < 0)
        goto done;
    known = known || PyDict_GET_SIZE(pids) < max_pids;
    if (known && note_pid(pids, pid, PyTuple_GET_ITEM(msg, 4)) < 0)
        goto done;
    if ((open = get(c.job, &JOB, J_OPEN)) == NULL || !PyDict_Check(open)) {
        if (open != NULL)
            PyErr_SetString(PyExc_TypeError, "job.open must be a dict");
        goto done;
    }
    c.opened = PyDict_GetItemWithError(open, pid);
    if (c.opened == NULL) {
        if (PyErr_Occurred())
            goto done;
        if (known && ((c.opened = PyList_New(0)) == NULL || PyDict_SetItem(open, pid, c.opened) < 0))
            goto done;
    } else if (!PyList_CheckExact(c.opened)) {
        c.opened = NULL;
        PyErr_SetString(PyExc_TypeError, "job.open values must be lists");
        goto done;
    } else {
        Py_INCREF(c.opened);
    }
    if (find_gpus(&c, msg) < 0)
        goto done;
    if ((c.ring = get(c.job, &JOB, J_RING)) == NULL || (c.phase_s = get(c.job, &JOB, J_PHASE_S)) == NULL ||
        (c.label = get(c.job, &JOB, J_LABEL)) == NULL || (width = get(c.ring, &RING, R_WIDTH)) == NULL ||
        as_ll(width, &c.width) < 0 || (cur_b = get(c.ring, &RING, R_CUR_B)) == NULL)
        goto done;
    if (c.width <= 0) {
        PyErr_SetString(PyExc_ValueError, "ring width must be positive");
        goto done;
    }
    c.cur = floordiv(c.now, c.width);
    long long cb;
    if (as_ll(cur_b, &cb) < 0)
        goto done;
    if (cb == c.cur) {
        if ((c.cur_slot = get(c.ring, &RING, R_CUR_I)) == NULL)
            goto done;
    } else {
        PyObject *curo = PyLong_FromLongLong(c.cur);
        if (curo == NULL)
            goto done;
        c.cur_slot = PyObject_CallMethodObjArgs(c.ring, s_slot, nowobj, nowobj, NULL);
        int bad = c.cur_slot == NULL || set(c.ring, &RING, R_CUR_I, c.cur_slot) < 0 ||
                  set(c.ring, &RING, R_CUR_B, curo) < 0;
        Py_DECREF(curo);
        if (bad)
            goto done;
    }
    if ((phases = PySequence_Fast(PyTuple_GET_ITEM(msg, 1), "msg.phases")) == NULL ||
        (steps = PySequence_Fast(PyTuple_GET_ITEM(msg, 2), "msg.steps")) == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(phases); j++)
        if (apply_phase(&c, PySequence_Fast_GET_ITEM(phases, j), &waited) < 0)
            goto done;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(steps); j++)
        if (apply_step(&c, PySequence_Fast_GET_ITEM(steps, j)) < 0)
            goto done;
    if (waited) {
        int due = track_due(refs, pid, uid, nowobj);
        PyObject *x = due > 0 ? PyObject_CallMethodObjArgs(refs->probe, s_track, pid, uid, nowobj, NULL) : NULL;
        if (due < 0 || (due > 0 && x == NULL))
            goto done;
        Py_XDECREF(x);
    }
    Py_INCREF(accepted);
    result = accepted;
done:
    Py_XDECREF(key);
    Py_XDECREF(c.job);
    Py_XDECREF(pids);
    Py_XDECREF(open);
    Py_XDECREF(c.opened);
    Py_XDECREF(c.gpus);
    Py_XDECREF(c.ring);
    Py_XDECREF(c.phase_s);
    Py_XDECREF(c.label);
    Py_XDECREF(c.cur_slot);
    Py_XDECREF(width);
    Py_XDECREF(cur_b);
    Py_XDECREF(phases);
    Py_XDECREF(steps);
    return result;
}

PyObject *fast_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "apply(table, msg, pid, uid, now_ns)");
        return NULL;
    }
    if (!table_ready) {
        PyErr_SetString(PyExc_RuntimeError, "agent.phases._fast.init_table() was not called");
        return NULL;
    }
    Refs refs;
    if (refs_fill(&refs, args[0]) < 0)
        return NULL;
    PyObject *r = refs_fill_gpus(&refs) < 0 ? NULL : apply_msg(&refs, args[1], args[2], args[3], args[4]);
    refs_clear(&refs);
    return r;
}

PyObject *fast_init_table(PyObject *self, PyObject *args)
{
    PyObject *phases, *jt, *rt, *deque, *odict, *pend, *resolve, *acc, *limit, *step, *kinds, *bk;
    long long opp, mp, dw, sk, isk;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OUUULLLLLO!O!", &PyTuple_Type, &phases, &PyType_Type, &jt, &PyType_Type,
                          &rt, &PyType_Type, &deque, &PyType_Type, &odict, &PyType_Type, &pend, &resolve, &acc, &limit,
                          &step, &opp, &mp, &dw, &sk, &isk, &PyTuple_Type, &kinds, &PyTuple_Type, &bk))
        return NULL;
    if (intern_all() < 0)
        return NULL;
    if (PyTuple_GET_SIZE(phases) != NP || !PyType_IsSubtype((PyTypeObject *)pend, &PyTuple_Type) ||
        PyTuple_GET_SIZE(kinds) > MAX_KINDS || PyTuple_GET_SIZE(bk) > MAX_BUCKETS || dw < 0 || dw >= NP ||
        opp < 1 || mp < 0 || !PyCallable_Check(resolve)) {
        PyErr_SetString(PyExc_ValueError, "init_table(): arguments out of range");
        return NULL;
    }
    for (int i = 0; i < NJ; i++)
        if (slot_offset((PyTypeObject *)jt, *job_names[i], &job_off[i]) < 0)
            return NULL;
    for (int i = 0; i < NR; i++)
        if (slot_offset((PyTypeObject *)rt, *ring_names[i], &ring_off[i]) < 0)
            return NULL;
    PyObject *append = PyObject_GetAttr(deque, s_append), *mte = PyObject_GetAttr(odict, s_move_to_end);
    if (append == NULL || mte == NULL || !PyObject_TypeCheck(append, &PyMethodDescr_Type) ||
        !PyObject_TypeCheck(mte, &PyMethodDescr_Type)) {
        Py_XDECREF(append);
        Py_XDECREF(mte);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "init_table(): deque.append and OrderedDict.move_to_end must be C methods");
        return NULL;
    }
    Py_XSETREF(deque_append, append);
    Py_XSETREF(odict_move_to_end, mte);
    Py_INCREF(jt);
    Py_XSETREF(job_type, (PyTypeObject *)jt);
    Py_INCREF(rt);
    Py_XSETREF(ring_type, (PyTypeObject *)rt);
    int nk = (int)PyTuple_GET_SIZE(kinds);
    for (int n = 0; n < nk; n++) {
        PyObject *ks = PyTuple_GET_ITEM(kinds, n);
        if (!PyTuple_Check(ks) || PyTuple_GET_SIZE(ks) > NP) {
            PyErr_SetString(PyExc_ValueError, "init_table(): each kind is a tuple of phase indices");
            return NULL;
        }
        kind_len[n] = (int)PyTuple_GET_SIZE(ks);
        for (int x = 0; x < kind_len[n]; x++) {
            long k = PyLong_AsLong(PyTuple_GET_ITEM(ks, x));
            if (k < 0 || k >= NP) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "init_table(): a phase index out of range");
                return NULL;
            }
            kind_order[n][x] = (int)k;
        }
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(bk); j++) {
        buckets[j] = PyFloat_AsDouble(PyTuple_GET_ITEM(bk, j));
        if (buckets[j] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    Py_INCREF(phases);
    Py_XSETREF(phases_tuple, phases);
    Py_INCREF(pend);
    Py_XSETREF(pending_type, (PyTypeObject *)pend);
    Py_INCREF(resolve);
    Py_XSETREF(resolve_gpus, resolve);
    Py_INCREF(acc);
    Py_XSETREF(accepted, acc);
    Py_INCREF(limit);
    Py_XSETREF(job_limit, limit);
    Py_INCREF(step);
    Py_XSETREF(step_name, step);
    nkinds = nk;
    nbuckets = PyTuple_GET_SIZE(bk);
    open_per_pid = opp;
    max_pids = mp;
    data_wait = dw;
    step_key = sk;
    in_step_key = isk;
    table_ready = 1;
    Py_RETURN_NONE;
}

/* ---- JobTable.handle for a burst of datagrams ---- */

static long long clamp_ns(__int128 v)
{
    return v < -1 ? -1 : v > (__int128)INT64_MAX ? INT64_MAX : (long long)v;
}

/* What handling one datagram needs from the table, looked up once per burst (see _fast_table.h). */
int handler_open(Handler *h, PyObject *tbl)
{
    if (!table_ready) {
        PyErr_SetString(PyExc_RuntimeError, "agent.phases._fast.init_table() was not called");
        return -1;
    }
    memset(h, 0, sizeof *h);
    if (refs_fill(&h->refs, tbl) < 0)
        return -1;
    PyObject *limits = PyObject_GetAttr(tbl, s_limits);
    h->clock = PyObject_GetAttr(h->refs.ctx, s_clock);
    h->lock = PyObject_GetAttr(tbl, s_lock);
    h->results = PyObject_GetAttr(tbl, s_results);
    int ok = -1;
    if (limits == NULL || h->clock == NULL || h->lock == NULL || h->results == NULL)
        goto done;
    if (!PyTuple_Check(limits) || PyTuple_GET_SIZE(limits) != 4 || !PyDict_Check(h->results)) {
        PyErr_SetString(PyExc_TypeError, "handle_batch(): table.limits must be a protocol.Limits, table.results a dict");
        goto done;
    }
    int fits = 1;
    for (int i = 0; i < 4; i++) {
        int overflow = 0;
        h->lim[i] = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(limits, i), &overflow);
        if (h->lim[i] == -1 && PyErr_Occurred())
            goto done;
        fits = fits && !overflow && h->lim[i] >= 0;
    }
    /* limits outside 64 bits: every datagram is left to handle() */
    h->usable = fits && h->lim[1] <= PY_SSIZE_T_MAX;
    ok = 0;
done:
    Py_XDECREF(limits);
    if (ok < 0)
        handler_close(h);
    return ok;
}

/* results["accepted"] += taken and the lock released; -1 (error set) if either failed, the lock
 * released all the same.  An error pending on entry is kept (and the result is -1). */
int handler_release(Handler *h)
{
    if (!h->held)
        return 0;
    PyObject *et, *ev, *tb;  /* the caller's error, if any, outlives what follows */
    PyErr_Fetch(&et, &ev, &tb);
    int r = 0;
    if (h->taken > 0) {
        PyObject *n = PyDict_GetItemWithError(h->results, accepted);  /* borrowed */
        PyObject *k = n ? PyLong_FromLongLong(h->taken) : NULL;
        PyObject *sum = k ? PyNumber_Add(n, k) : NULL;
        if (sum == NULL || PyDict_SetItem(h->results, accepted, sum) < 0)
            r = -1;
        if (r < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "results has no 'accepted' count");
        Py_XDECREF(k);
        Py_XDECREF(sum);
        h->taken = 0;
    }
    PyObject *e2, *v2, *t2;  /* the counting error, if any, across the release */
    PyErr_Fetch(&e2, &v2, &t2);
    PyObject *rel = PyObject_CallMethodNoArgs(h->lock, s_release);
    h->held = 0;
    refs_clear_gpus(&h->refs);
    if (rel == NULL) {
        r = -1;  /* the release's error replaces the counting's */
    } else {
        Py_DECREF(rel);
        PyErr_Restore(e2, v2, t2);
        e2 = v2 = t2 = NULL;
    }
    Py_XDECREF(e2);
    Py_XDECREF(v2);
    Py_XDECREF(t2);
    if (et != NULL) {
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
        r = -1;
    }
    return r;
}

void handler_close(Handler *h)
{
    if (h->held) {  /* callers release first: this is the last resort, and keeps their error */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (handler_release(h) < 0)
            PyErr_WriteUnraisable(h->lock);
        PyErr_Restore(et, ev, tb);
    }
    refs_clear(&h->refs);
    Py_CLEAR(h->clock);
    Py_CLEAR(h->lock);
    Py_CLEAR(h->results);
}

/* One datagram through decode() and apply() under table._lock (taken here if not held): 1 applied
 * (counted as accepted at handler_release()), 0 left for the Python path (no credentials, declined
 * by the decoder, or not accepted), -1 error. */
int handler_take(Handler *h, const char *data, Py_ssize_t len, PyObject *pid, PyObject *uid)
{
    if (!h->usable || pid == Py_None || uid == Py_None || len > h->lim[0])
        return 0;
    PyObject *nowobj = PyObject_CallNoArgs(h->clock);
    long long now;
    if (nowobj == NULL || as_ll(nowobj, &now) < 0) {
        Py_XDECREF(nowobj);
        return -1;
    }
    /* protocol.decode's window, clamped into -1..MAX_NS the same way */
    __int128 lo = (__int128)now - h->lim[2], hi = (__int128)now + h->lim[3];
    long long lo64 = (long long)lo, hi64 = (long long)hi;
    if (!(-1 <= lo && lo <= hi && hi <= (__int128)INT64_MAX)) {
        lo64 = clamp_ns(lo);
        hi64 = clamp_ns(hi);
    }
    PyObject *msg = decode_bytes(data, len, lo64, hi64, (Py_ssize_t)h->lim[1]);
    if (msg == NULL || msg == Py_None) {
        Py_DECREF(nowobj);
        Py_XDECREF(msg);
        return msg == NULL ? -1 : 0;
    }
    int r = -1;
    if (!h->held) {
        PyObject *got = PyObject_CallMethodNoArgs(h->lock, s_acquire);
        if (got == NULL)
            goto out;
        Py_DECREF(got);
        h->held = 1;
        if (refs_fill_gpus(&h->refs) < 0) {
            handler_release(h);  /* keeps the error; the next datagram tries again */
            goto out;
        }
    }
    PyObject *result = apply_msg(&h->refs, msg, pid, uid, nowobj);
    if (result == accepted) {
        h->taken++;
        r = 1;
    } else if (result != NULL) {
        r = 0;  /* job_limit: nothing applied; handle() counts it and says why */
    }
    Py_XDECREF(result);
out:
    Py_DECREF(nowobj);
    Py_DECREF(msg);
    return r;
}

PyObject *fast_handle_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "handle_batch(table, [(data, pid, uid)], start)");
        return NULL;
    }
    PyObject *batch = args[1];
    Py_ssize_t j = PyLong_AsSsize_t(args[2]);
    if (j == -1 && PyErr_Occurred())
        return NULL;
    if (j < 0) {
        PyErr_SetString(PyExc_ValueError, "handle_batch(): start must not be negative");
        return NULL;
    }
    Handler h;
    if (handler_open(&h, args[0]) < 0)
        return NULL;
    /* in order: stop at the first datagram left to handle() */
    for (; j < PyList_GET_SIZE(batch); j++) {
        PyObject *item = PyList_GET_ITEM(batch, j);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "handle_batch(): each datagram is (data, pid, uid)");
            handler_close(&h);
            return NULL;
        }
        PyObject *data = PyTuple_GET_ITEM(item, 0);
        if (!PyBytes_Check(data))
            break;
        int r = handler_take(&h, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), PyTuple_GET_ITEM(item, 1),
                             PyTuple_GET_ITEM(item, 2));
        if (r < 0) {
            handler_close(&h);
            return NULL;
        }
        if (r == 0)
            break;
    }
    int ok = handler_release(&h);
    handler_close(&h);
    return ok < 0 ? NULL : PyLong_FromSsize_t(j);
}
