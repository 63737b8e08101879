/* The phase path's hot spots in C: receiving datagrams with their credentials, decoding the usual
 * valid message, and (in _fast_table.c) applying it to the job table.  Optional: setup.py builds
 * it when a C compiler and Python's headers are there, and agent/phases falls back to the Python
 * code when it is not (see docs/phases.md).
 *
 * decode() accepts only a strict subset of protocol version 1 and returns None for everything
 * else, so that protocol.decode (the Python code, which is the specification) judges it: its
 * rejection reasons and messages are written once.  The subset: ASCII bytes, JSON whitespace
 * anywhere between tokens, an object whose keys are some of v, job, phases, steps, cvd, dropped,
 * each at most once and without escapes; v the integer 1; a valid job name; records that pass
 * every check; integers written as JSON integers without sign, fraction or exponent, below 10^18.
 * On that subset it returns exactly what protocol.decode returns (tests/phases/test_fast.py checks
 * it against the Python code on generated and mutated datagrams).
 *
 * apply() (in _fast_table.c) is JobTable._apply on the same Python state; handle_batch() runs a
 * receive's datagrams through decode() and apply() in order, up to the first it leaves to Python.
 *
 * recv_batch() blocks (without the GIL) for one datagram, then takes what else is queued without
 * blocking, up to max_n: one trip through the interpreter for a burst instead of one per datagram.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include "_fast_table.h"

#define MAX_NAME 128                     /* protocol.JOB_NAME: 1 + up to 127 characters */
#define NPHASES 7

/* Set by init(): the Message type, the phase names (protocol.PHASES, "other" last) as str objects,
 * and protocol's MAX_INTERVAL_NS, MAX_SAMPLES and MAX_CVD_CHARS (the limits exist once, there). */
static PyTypeObject *message_type = NULL;
static long long max_interval_ns, max_samples;
static Py_ssize_t max_cvd_chars;
static PyObject *phase_names[NPHASES];
static const char *phase_chars[NPHASES];
static Py_ssize_t phase_lens[NPHASES];
static int ready = 0;

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cursor;

static inline void ws(Cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static inline int eat(Cursor *c, unsigned char ch)
{
    ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A string without escapes: printable ASCII but '"' and '\\'.  Sets *s, *n; 0 if outside the subset. */
static int string(Cursor *c, const char **s, Py_ssize_t *n)
{
    if (!eat(c, '"'))
        return 0;
    const unsigned char *start = c->p;
    while (c->p < c->end) {
        unsigned char ch = *c->p;
        if (ch == '"') {
            *s = (const char *)start;
            *n = c->p - start;
            c->p++;
            return 1;
        }
        if (ch == '\\' || ch < 0x20 || ch >= 0x80)
            return 0;
        c->p++;
    }
    return 0;
}

/* A JSON integer without sign, fraction or exponent, below 10^18. */
static int integer(Cursor *c, int64_t *out)
{
    ws(c);
    const unsigned char *start = c->p;
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        if (c->p - start >= 18)
            return 0;
        v = v * 10 + (*c->p - '0');
        c->p++;
    }
    Py_ssize_t digits = c->p - start;
    if (digits == 0 || (digits > 1 && *start == '0'))
        return 0;
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E'))
        return 0;
    *out = v;
    return 1;
}

static inline int literal(Cursor *c, const char *word, Py_ssize_t n)
{
    ws(c);
    if (c->end - c->p >= n && memcmp(c->p, word, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int name_char(unsigned char ch, int first)
{
    if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))
        return 1;
    return !first && (ch == '_' || ch == '.' || ch == ':' || ch == '@' || ch == '+' || ch == '=' || ch == '-');
}

static inline int good_span(int64_t s, int64_t e, int64_t lo, int64_t hi)
{
    /* protocol.decode: 0 <= s <= e <= hi and e >= lo and e - s <= MAX_INTERVAL_NS (s, e >= 0 here) */
    return s <= e && e <= hi && e >= lo && e - s <= max_interval_ns;
}

static PyObject *phase_name(const char *s, Py_ssize_t n)
{
    for (int i = 0; i < NPHASES; i++)
        if (n == phase_lens[i] && memcmp(s, phase_chars[i], n) == 0)
            return phase_names[i];
    return phase_names[NPHASES - 1]; /* "other" */
}

/* Appends 3-tuples to list; returns 1, 0 (outside the subset) or -1 (Python error). */
static int records(Cursor *c, PyObject *list, int is_phase, int64_t lo, int64_t hi, Py_ssize_t *count)
{
    if (!eat(c, '['))
        return 0;
    if (eat(c, ']'))
        return 1;
    do {
        const char *s = NULL;
        Py_ssize_t n = 0;
        int64_t a, b, x = 0;
        if (!eat(c, '['))
            return 0;
        if (is_phase) {
            if (!string(c, &s, &n) || !eat(c, ','))
                return 0;
        }
        if (!integer(c, &a) || !eat(c, ',') || !integer(c, &b))
            return 0;
        if (!is_phase && (!eat(c, ',') || !integer(c, &x) || x > max_samples))
            return 0;
        if (!eat(c, ']') || !good_span(a, b, lo, hi))
            return 0;
        PyObject *first = is_phase ? phase_name(s, n) : PyLong_FromLongLong(a);
        if (first == NULL)
            return -1;
        if (is_phase)
            Py_INCREF(first);
        PyObject *rec = PyTuple_New(3);
        if (rec == NULL) {
            Py_DECREF(first);
            return -1;
        }
        PyTuple_SET_ITEM(rec, 0, first);
        PyObject *second = PyLong_FromLongLong(is_phase ? a : b);
        PyObject *third = second ? PyLong_FromLongLong(is_phase ? b : x) : NULL;
        if (third == NULL) {
            Py_XDECREF(second);
            Py_DECREF(rec);
            return -1;
        }
        PyTuple_SET_ITEM(rec, 1, second);
        PyTuple_SET_ITEM(rec, 2, third);
        int err = PyList_Append(list, rec);
        Py_DECREF(rec);
        if (err < 0)
            return -1;
        (*count)++;
    } while (eat(c, ','));
    return eat(c, ']');
}

/* protocol.decode's cvd: tuple(p.strip() for p in raw.split(",") if p.strip()); only ' ' can be
 * whitespace here (control characters are not in the subset). */
static PyObject *split_cvd(const char *s, Py_ssize_t n)
{
    PyObject *parts = PyList_New(0);
    if (parts == NULL)
        return NULL;
    Py_ssize_t i = 0;
    while (i <= n) {
        Py_ssize_t j = i;
        while (j < n && s[j] != ',')
            j++;
        Py_ssize_t a = i, b = j;
        while (a < b && s[a] == ' ')
            a++;
        while (b > a && s[b - 1] == ' ')
            b--;
        if (b > a) {
            PyObject *part = PyUnicode_DecodeASCII(s + a, b - a, NULL);
            if (part == NULL || PyList_Append(parts, part) < 0) {
                Py_XDECREF(part);
                Py_DECREF(parts);
                return NULL;
            }
            Py_DECREF(part);
        }
        i = j + 1;
    }
    PyObject *out = PyList_AsTuple(parts);
    Py_DECREF(parts);
    return out;
}

/* The job name as a str, from a small cache of recent names: a job sends every step, so the same
 * few names come again and again, and a cached str keeps its hash for the table's lookup.  The
 * cache holds at most JOB_CACHE names (strong references, replaced on collision). */
#define JOB_CACHE 64
static PyObject *job_cache[JOB_CACHE];

static PyObject *job_str(const char *s, Py_ssize_t n)
{
    uint32_t h = 2166136261u;  /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    PyObject **slot = &job_cache[h % JOB_CACHE];
    if (*slot != NULL && PyUnicode_GET_LENGTH(*slot) == n && memcmp(PyUnicode_DATA(*slot), s, (size_t)n) == 0) {
        Py_INCREF(*slot);
        return *slot;
    }
    PyObject *str = PyUnicode_DecodeASCII(s, n, NULL);
    if (str != NULL) {
        Py_INCREF(str);
        Py_XSETREF(*slot, str);
    }
    return str;
}

enum { K_V = 1, K_JOB = 2, K_PHASES = 4, K_STEPS = 8, K_CVD = 16, K_DROPPED = 32 };

static int key_of(const char *s, Py_ssize_t n)
{
    switch (n) {
    case 1: return s[0] == 'v' ? K_V : 0;
    case 3: return memcmp(s, "job", 3) == 0 ? K_JOB : (memcmp(s, "cvd", 3) == 0 ? K_CVD : 0);
    case 5: return memcmp(s, "steps", 5) == 0 ? K_STEPS : 0;
    case 6: return memcmp(s, "phases", 6) == 0 ? K_PHASES : 0;
    case 7: return memcmp(s, "dropped", 7) == 0 ? K_DROPPED : 0;
    default: return 0;
    }
}

/* The body of decode(): 1 with *out set, 0 outside the subset, -1 on a Python error. */
static int decode_subset(Cursor *c, int64_t lo, int64_t hi, Py_ssize_t max_records, PyObject *phases,
                         PyObject *steps, PyObject **out)
{
    int seen = 0;
    int64_t v = -1, dropped = 0;
    const char *job = NULL, *cvd = NULL;
    Py_ssize_t job_n = 0, cvd_n = 0, count = 0;
    if (!eat(c, '{'))
        return 0;
    if (!eat(c, '}')) {
        do {
            const char *k;
            Py_ssize_t kn;
            if (!string(c, &k, &kn) || !eat(c, ':'))
                return 0;
            int key = key_of(k, kn);
            if (key == 0 || (seen & key))
                return 0; /* an unknown key (ignored by the protocol) or a repeated one: Python decides */
            seen |= key;
            int r = 1;
            switch (key) {
            case K_V:
                r = integer(c, &v);
                break;
            case K_JOB:
                r = string(c, &job, &job_n);
                break;
            case K_PHASES:
                r = records(c, phases, 1, lo, hi, &count);
                break;
            case K_STEPS:
                r = records(c, steps, 0, lo, hi, &count);
                break;
            case K_CVD:
                if (literal(c, "null", 4))
                    cvd = NULL;
                else
                    r = string(c, &cvd, &cvd_n) && cvd_n <= max_cvd_chars;
                break;
            case K_DROPPED:
                r = integer(c, &dropped);
                break;
            }
            if (r <= 0)
                return r;
        } while (eat(c, ','));
        if (!eat(c, '}'))
            return 0;
    }
    ws(c);
    if (c->p != c->end || !(seen & K_V) || !(seen & K_JOB) || v != 1 || count > max_records)
        return 0;
    if (job_n < 1 || job_n > MAX_NAME || !name_char((unsigned char)job[0], 1))
        return 0;
    for (Py_ssize_t i = 1; i < job_n; i++)
        if (!name_char((unsigned char)job[i], 0))
            return 0;

    PyObject *msg = message_type->tp_alloc(message_type, 5);
    if (msg == NULL)
        return -1;
    PyObject *items[5];
    items[0] = job_str(job, job_n);  /* ASCII: checked above */
    items[1] = PyList_AsTuple(phases);
    items[2] = PyList_AsTuple(steps);
    items[3] = cvd ? split_cvd(cvd, cvd_n) : PyTuple_New(0);
    items[4] = PyLong_FromLongLong(dropped);
    for (int i = 0; i < 5; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 5; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(msg);
            return -1;
        }
    }
    for (int i = 0; i < 5; i++)
        PyTuple_SET_ITEM(msg, i, items[i]);
    *out = msg;
    return 1;
}

PyObject *decode_bytes(const char *data, Py_ssize_t len, long long lo, long long hi, Py_ssize_t max_records)
{
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "agent.phases._fast.init() was not called");
        return NULL;
    }
    PyObject *phases = PyList_New(0), *steps = PyList_New(0), *out = NULL;
    int r = -1;
    if (phases && steps) {
        Cursor c = {(const unsigned char *)data, (const unsigned char *)data + len};
        r = decode_subset(&c, lo, hi, max_records, phases, steps, &out);
    }
    Py_XDECREF(phases);
    Py_XDECREF(steps);
    if (r < 0)
        return NULL;
    if (r == 0)
        Py_RETURN_NONE;
    return out;
}

static PyObject *fast_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode(data, lo_ns, hi_ns, max_records)");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    long long lo = PyLong_AsLongLong(args[1]);
    long long hi = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[2]);
    Py_ssize_t max_records = PyErr_Occurred() ? 0 : PyLong_AsSsize_t(args[3]);
    PyObject *out = PyErr_Occurred() ? NULL : decode_bytes(buf.buf, buf.len, lo, hi, max_records);
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *fast_init(PyObject *self, PyObject *args)
{
    PyObject *type, *names;
    long long interval, samples;
    Py_ssize_t cvd_chars;
    if (!PyArg_ParseTuple(args, "O!O!LLn", &PyType_Type, &type, &PyTuple_Type, &names, &interval, &samples,
                          &cvd_chars))
        return NULL;
    if (interval < 0 || samples < 0 || cvd_chars < 0) {
        PyErr_SetString(PyExc_ValueError, "init(): the limits must not be negative");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type) || PyTuple_GET_SIZE(names) != NPHASES) {
        PyErr_SetString(PyExc_ValueError, "init(Message, PHASES, ...): a tuple subclass and 7 phase names");
        return NULL;
    }
    for (int i = 0; i < NPHASES; i++) {
        PyObject *n = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_Check(n) || !PyUnicode_IS_ASCII(n)) {
            PyErr_SetString(PyExc_ValueError, "phase names must be ASCII str");
            return NULL;
        }
    }
    if (strcmp(PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, NPHASES - 1)), "other") != 0) {
        PyErr_SetString(PyExc_ValueError, "the last phase name must be 'other'");
        return NULL;
    }
    for (int i = 0; i < NPHASES; i++) {
        PyObject *n = PyTuple_GET_ITEM(names, i);
        Py_INCREF(n);
        Py_XSETREF(phase_names[i], n);
        phase_chars[i] = PyUnicode_AsUTF8AndSize(n, &phase_lens[i]);
    }
    Py_INCREF(type);
    Py_XSETREF(message_type, (PyTypeObject *)type);
    max_interval_ns = interval;
    max_samples = samples;
    max_cvd_chars = cvd_chars;
    ready = 1;
    Py_RETURN_NONE;
}

/* The sender's SCM_CREDENTIALS, if the kernel attached them. */
static int credentials(struct msghdr *mh, struct ucred *cred)
{
    int have = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
            cm->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            memcpy(cred, CMSG_DATA(cm), sizeof *cred);
            have = 1;
        }
    }
    return have;
}

/* One received datagram as (data, pid, uid); pid and uid None without SCM_CREDENTIALS. */
static PyObject *datagram(const char *data, ssize_t n, struct msghdr *mh)
{
    struct ucred cred;
    if (credentials(mh, &cred))
        return Py_BuildValue("(y#lk)", data, (Py_ssize_t)n, (long)cred.pid, (unsigned long)cred.uid);
    return Py_BuildValue("(y#OO)", data, (Py_ssize_t)n, Py_None, Py_None);
}

static PyObject *fast_recv_batch(PyObject *self, PyObject *args)
{
    int fd;
    Py_ssize_t bufsize, max_n;
    if (!PyArg_ParseTuple(args, "inn", &fd, &bufsize, &max_n))
        return NULL;
    if (bufsize < 1 || max_n < 1) {
        PyErr_SetString(PyExc_ValueError, "recv_batch: bufsize and max_n must be positive");
        return NULL;
    }
    char *data = PyMem_RawMalloc(bufsize);
    if (data == NULL)
        return PyErr_NoMemory();
    /* room for the credentials and nothing more, as the Python receiver asks: file descriptors
     * a sender attaches (SCM_RIGHTS) do not fit, so the kernel never installs them here */
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } control;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyMem_RawFree(data);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < max_n; i++) {
        struct iovec iov = {data, (size_t)bufsize};
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control.buf;
        mh.msg_controllen = sizeof control.buf;
        ssize_t n;
        int err;
        if (i == 0) {
            /* the first datagram: wait for it without the GIL; EINTR runs signal handlers and retries */
            for (;;) {
                Py_BEGIN_ALLOW_THREADS
                n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
                err = errno;
                Py_END_ALLOW_THREADS
                if (n >= 0 || err != EINTR)
                    break;
                if (PyErr_CheckSignals() < 0) {
                    PyMem_RawFree(data);
                    Py_DECREF(out);
                    return NULL;
                }
                mh.msg_controllen = sizeof control.buf;
            }
            if (n < 0) {
                PyMem_RawFree(data);
                Py_DECREF(out);
                errno = err;
                return PyErr_SetFromErrno(PyExc_OSError);
            }
        } else {
            /* the rest of the burst, without blocking and without releasing the GIL (a syscall
             * that returns at once); any error ends the batch and the next call reports it */
            n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
            if (n < 0)
                break;
        }
        PyObject *t = datagram(data, n, &mh);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            PyMem_RawFree(data);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
        if (n == 0)
            break; /* an empty datagram is the receiver's wake-up call: hand it over now */
    }
    PyMem_RawFree(data);
    return out;
}

/* The receiver's loop in C: recvmmsg() blocks (without the GIL) for the first datagram and takes
 * what else is queued; each datagram goes through handler_take() from the receive buffer (no
 * bytes or tuple objects) and the thread goes back to waiting without a trip through the
 * interpreter.  counts is [datagrams, receives]: both grow as it goes, so the receiver's figures
 * stay current while this runs.  It returns (handled, rest, error):
 *   - ([], None) once budget datagrams are handled (the receiver checks its rate limit there), or
 *     after a receive error once something was handled (the next call meets the error again);
 *   - rest [(data, pid, uid), ...]: the datagrams of the last receive from the first one
 *     handler_take() leaves to JobTable.handle() on, in order; the empty datagram close() sends
 *     to wake the thread is one of those;
 *   - error: the exception handling a datagram raised (a bug, or no memory), as a value: that
 *     datagram is dropped, the ones received after it come back in rest, nothing else is lost.
 * A receive error with nothing handled is raised as OSError, as recvmsg raises it.
 *
 * linger_us > 0 moderates wake-ups the way a NIC moderates interrupts: when a receive emptied the
 * queue less than BUSY_NS after the previous one (a busy socket), the thread sleeps linger_us
 * before it waits again, so the datagrams of that time arrive as one receive: one wake-up, a warm
 * cache, instead of one each.  An idle socket never lingers (no latency, no extra wake-up); a busy
 * one delays its datagrams by at most linger_us, which the kernel queue must hold (the receiver
 * sizes it: agent/phases/receiver.py). */
#define SERVE_VLEN 16
#define BUSY_NS 1000000LL

/* counts[i] += k (the list was checked to hold two ints) */
static int add_count(PyObject *counts, Py_ssize_t i, int k)
{
    PyObject *n = PyLong_FromLong(k), *sum = n ? PyNumber_Add(PyList_GET_ITEM(counts, i), n) : NULL;
    Py_XDECREF(n);
    return sum == NULL ? -1 : PyList_SetItem(counts, i, sum);  /* steals sum, drops the old count */
}

static long long monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The pending exception as a value (with its traceback), cleared. */
static PyObject *caught(void)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (ev != NULL && tb != NULL)
        PyException_SetTraceback(ev, tb);
    Py_XDECREF(et);
    Py_XDECREF(tb);
    if (ev == NULL) {
        ev = Py_None;
        Py_INCREF(ev);
    }
    return ev;
}

static PyObject *fast_serve(PyObject *self, PyObject *args)
{
    PyObject *tbl, *counts;
    int fd;
    Py_ssize_t bufsize, budget, linger_us = 0;
    if (!PyArg_ParseTuple(args, "OinnO!|n", &tbl, &fd, &bufsize, &budget, &PyList_Type, &counts, &linger_us))
        return NULL;
    if (bufsize < 1 || budget < 1 || linger_us < 0 || linger_us >= 1000000) {
        PyErr_SetString(PyExc_ValueError, "serve: bufsize and budget must be positive, linger_us in [0, 1000000)");
        return NULL;
    }
    if (PyList_GET_SIZE(counts) != 2 || !PyLong_CheckExact(PyList_GET_ITEM(counts, 0)) ||
        !PyLong_CheckExact(PyList_GET_ITEM(counts, 1))) {
        PyErr_SetString(PyExc_TypeError, "serve: counts must be a list of two ints [datagrams, receives]");
        return NULL;
    }
    Handler h;
    if (handler_open(&h, tbl) < 0)
        return NULL;
    char *data = PyMem_RawMalloc((size_t)bufsize * SERVE_VLEN);
    if (data == NULL) {
        handler_close(&h);
        return PyErr_NoMemory();
    }
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } control[SERVE_VLEN];
    struct iovec iov[SERVE_VLEN];
    struct mmsghdr mm[SERVE_VLEN];
    Py_ssize_t handled = 0;
    PyObject *rest = NULL, *error = NULL, *out = NULL;
    long long last_wake = 0;
    while (handled < budget && rest == NULL && error == NULL) {
        unsigned int vlen = (unsigned int)(budget - handled < SERVE_VLEN ? budget - handled : SERVE_VLEN);
        for (unsigned int i = 0; i < vlen; i++) {
            iov[i].iov_base = data + (size_t)i * bufsize;
            iov[i].iov_len = (size_t)bufsize;
            memset(&mm[i].msg_hdr, 0, sizeof mm[i].msg_hdr);
            mm[i].msg_hdr.msg_iov = &iov[i];
            mm[i].msg_hdr.msg_iovlen = 1;
            mm[i].msg_hdr.msg_control = control[i].buf;
            mm[i].msg_hdr.msg_controllen = sizeof control[i].buf;
        }
        int k, err;
        Py_BEGIN_ALLOW_THREADS
        k = recvmmsg(fd, mm, vlen, MSG_WAITFORONE | MSG_CMSG_CLOEXEC, NULL);
        err = errno;
        Py_END_ALLOW_THREADS
        if (k < 0) {
            if (err == EINTR) {
                if (PyErr_CheckSignals() < 0)
                    goto done;
                continue;
            }
            if (handled > 0)
                break; /* report what was handled; the next call meets the error again */
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        long long wake = linger_us > 0 ? monotonic_ns() : 0;
        int busy = last_wake != 0 && wake - last_wake < BUSY_NS;
        last_wake = wake;
        int i = 0;
        if (add_count(counts, 0, k) < 0 || add_count(counts, 1, 1) < 0)
            error = caught(); /* all k come back in rest */
        for (; error == NULL && i < k; i++) {
            Py_ssize_t n = (Py_ssize_t)mm[i].msg_len;
            struct ucred cred;
            int r = 0;
            if (n > 0 && credentials(&mm[i].msg_hdr, &cred)) {
                PyObject *pid = PyLong_FromLong((long)cred.pid), *uid = PyLong_FromUnsignedLong(cred.uid);
                r = (pid && uid) ? handler_take(&h, data + (size_t)i * bufsize, n, pid, uid) : -1;
                Py_XDECREF(pid);
                Py_XDECREF(uid);
            }
            if (r == 0)
                break;
            if (r < 0)
                error = caught(); /* i++ drops this one; the rest come back */
            else
                handled++;
        }
        if (handler_release(&h) < 0 && error == NULL)
            error = caught(); /* what was taken is applied; only its count or the unlock failed */
        if (i < k) {
            rest = PyList_New(0);
            for (; rest != NULL && i < k; i++) {
                PyObject *t = datagram(data + (size_t)i * bufsize, (ssize_t)mm[i].msg_len, &mm[i].msg_hdr);
                if (t == NULL || PyList_Append(rest, t) < 0)
                    Py_CLEAR(rest);
                Py_XDECREF(t);
            }
            if (rest == NULL)
                goto done; /* out of memory */
        }
        if (busy && rest == NULL && error == NULL && (unsigned int)k < vlen && handled < budget) {
            struct timespec ts = {0, (long)linger_us * 1000};
            Py_BEGIN_ALLOW_THREADS
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
        }
    }
    if (rest == NULL && (rest = PyList_New(0)) == NULL)
        goto done;
    out = Py_BuildValue("(nOO)", handled, rest, error ? error : Py_None);
done:
    PyMem_RawFree(data);
    handler_close(&h);
    Py_XDECREF(rest);
    Py_XDECREF(error);
    return out;
}

static PyMethodDef methods[] = {
    {"init", fast_init, METH_VARARGS,
     "init(Message, PHASES, MAX_INTERVAL_NS, MAX_SAMPLES, MAX_CVD_CHARS): what decode() builds and checks"},
    {"decode", (PyCFunction)(void (*)(void))fast_decode, METH_FASTCALL,
     "decode(data, lo_ns, hi_ns, max_records) -> Message, or None outside the subset C handles"},
    {"recv_batch", fast_recv_batch, METH_VARARGS,
     "recv_batch(fd, bufsize, max_n) -> [(data, pid, uid)]: block for one datagram, then take up to "
     "max_n - 1 more that are queued"},
    {"serve", fast_serve, METH_VARARGS,
     "serve(table, fd, bufsize, budget, counts[, linger_us]) -> (handled, [(data, pid, uid)], error): receive "
     "and handle in C until budget datagrams are handled or one is left to JobTable.handle() (returned with the "
     "rest of its receive); counts = [datagrams, receives], updated as it goes; error: what handling a datagram "
     "raised, or None; linger_us: on a busy socket, sleep that long after a receive so that the next takes more"},
    {"init_table", fast_init_table, METH_VARARGS,
     "init_table(PHASES, deque, Pending, resolve_gpus, ACCEPTED, 'job_limit', 'step', OPEN_PER_PID, MAX_PIDS, "
     "DATA_WAIT, STEP, IN_STEP, kinds, STEP_BUCKETS): what apply() builds and checks (agent/phases/jobs.py)"},
    {"apply", (PyCFunction)(void (*)(void))fast_apply, METH_FASTCALL,
     "apply(table, msg, pid, uid, now_ns) -> result: JobTable._apply in C, on the same state"},
    {"handle_batch", (PyCFunction)(void (*)(void))fast_handle_batch, METH_FASTCALL,
     "handle_batch(table, [(data, pid, uid)], start) -> index: JobTable.handle in C for the datagrams from start "
     "on, in order, up to the first that decode() declines or the table does not accept (its index; len: none)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "agent.phases._fast",
                                    "The phase path's receive, decode and job-table update in C (optional).", -1, methods};

PyMODINIT_FUNC PyInit__fast(void)
{
    return PyModule_Create(&module);
}
