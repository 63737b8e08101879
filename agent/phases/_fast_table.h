/* The job table's message path in C (_fast_table.c), exported to the _fast module (_fast.c). */
#ifndef TEYE_FAST_TABLE_H
#define TEYE_FAST_TABLE_H
#include <Python.h>

PyObject *fast_init_table(PyObject *self, PyObject *args);
PyObject *fast_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *fast_handle_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _fast.c's decoder over a buffer: a Message, Py_None (outside the subset it takes), or NULL. */
PyObject *decode_bytes(const char *data, Py_ssize_t len, long long lo, long long hi, Py_ssize_t max_records);

#endif
