/* The job table's message path in C (_fast_table.c), exported to the _fast module (_fast.c). */
#ifndef TEYE_FAST_TABLE_H
#define TEYE_FAST_TABLE_H
#include <Python.h>

PyObject *fast_init_table(PyObject *self, PyObject *args);
PyObject *fast_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *fast_handle_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* What apply() reads from the table besides the job: looked up per call by apply(), and once per
 * burst by the handler below (known_gpus and gpu_pids once per hold of the table's lock, since
 * JobTable.attribute() and the GPU source replace them).  All owned; probe_pids and retrack may be
 * NULL (the probe has none: probe.track() decides). */
typedef struct {
    PyObject *tbl;                            /* borrowed */
    PyObject *ctx, *jobs, *recorded, *probe;  /* table.ctx, ._jobs, .recorded, .probe */
    PyObject *probe_pids, *retrack;           /* probe._pids, probe.RETRACK_NS */
    PyObject *known_gpus, *gpu_pids;          /* table._known_gpus, ctx.gpu_pids */
} Refs;

/* handle_batch()'s work for one datagram, for any caller (the receive loop in _fast.c too):
 * handler_open() looks up the table's clock, lock, results, limits and Refs once; handler_take()
 * decodes and applies one datagram under the table's lock: 1 taken, 0 left to JobTable.handle()
 * (no credentials, over max_bytes, declined by the decoder, or not accepted), -1 error set.
 * The lock, taken by the first handler_take(), stays held for the burst: handler_release() adds
 * the datagrams taken to results["accepted"] and releases it (-1 with an error set if either
 * fails).  Call it before anything that blocks or runs JobTable.handle(); handler_close() calls
 * it too. */
typedef struct {
    PyObject *clock, *lock, *results;        /* owned: ctx.clock, table._lock, table.results */
    Refs refs;
    long long lim[4];                        /* protocol.Limits: max_bytes, max_records, max_age_ns, future_slack_ns */
    long long taken;                         /* applied since the lock was taken, not yet counted */
    int usable, held;
} Handler;
int handler_open(Handler *h, PyObject *tbl);
int handler_take(Handler *h, const char *data, Py_ssize_t len, PyObject *pid, PyObject *uid);
int handler_release(Handler *h);
void handler_close(Handler *h);

/* _fast.c's decoder over a buffer: a Message, Py_None (outside the subset it takes), or NULL. */
PyObject *decode_bytes(const char *data, Py_ssize_t len, long long lo, long long hi, Py_ssize_t max_records);

#endif
