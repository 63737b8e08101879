/* The job table's message path in C (_fast_table.c), exported to the _fast module (_fast.c). */
#ifndef TEYE_FAST_TABLE_H
#define TEYE_FAST_TABLE_H
#include <Python.h>

PyObject *fast_init_table(PyObject *self, PyObject *args);
PyObject *fast_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *fast_handle_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* handle_batch()'s work for one datagram, for any caller (the receive loop in _fast.c too):
 * handler_open() looks up the table's clock, lock, results and limits once; handler_take()
 * decodes, applies under the lock and counts one datagram: 1 taken, 0 left to JobTable.handle()
 * (no credentials, over max_bytes, declined by the decoder, or not accepted), -1 error set. */
typedef struct {
    PyObject *tbl, *ctx, *clock, *lock, *results;  /* tbl borrowed, the rest owned */
    long long lim[4];                             /* protocol.Limits: max_bytes, max_records, max_age_ns, future_slack_ns */
    int usable;
} Handler;
int handler_open(Handler *h, PyObject *tbl);
int handler_take(Handler *h, const char *data, Py_ssize_t len, PyObject *pid, PyObject *uid);
void handler_close(Handler *h);

/* _fast.c's decoder over a buffer: a Message, Py_None (outside the subset it takes), or NULL. */
PyObject *decode_bytes(const char *data, Py_ssize_t len, long long lo, long long hi, Py_ssize_t max_records);

#endif
