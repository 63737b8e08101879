/* The job table's message path in C (_fast_table.c), exported to the _fast module (_fast.c). */
#ifndef TEYE_FAST_TABLE_H
#define TEYE_FAST_TABLE_H
#include <Python.h>

PyObject *fast_init_table(PyObject *self, PyObject *args);
PyObject *fast_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
