/* The exact vector search's fast path (gateway/context/store/common.py).
 *
 *   admitted(query: bytes, rows: list[tuple[str, bytes | None]], min_cosine: float)
 *       -> list[tuple[float, str]]
 *       common.admitted_reference: `query` holds the query's unit vector as native float64
 *       values; each row is (artifact id, its stored vector as native float32 values, or
 *       None). A row whose vector is missing or of another dimension is skipped; for the
 *       others the cosine is the dot product accumulated in order, one double at a time
 *       (each float32 widened to a double, each product rounded, then added), and the row is
 *       kept, as (cosine, id), when the cosine is at least `min_cosine` (never when it is
 *       not a number). Rows come back in their order.
 *
 * The order and width of the arithmetic are the reference's, so both give the same bits:
 * compiled as ISO C (setup.py: -std=c11), GCC neither contracts a product and a sum into a
 * fused multiply-add nor reorders the additions.
 *
 * Pure: no I/O, no state. The GIL is held throughout (the inputs are immutable).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

static PyObject *admitted(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "admitted(query, rows, min_cosine)");
        return NULL;
    }
    PyObject *query = args[0], *rows = args[1];
    if (!PyBytes_Check(query) || !PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "admitted: query must be bytes and rows a list");
        return NULL;
    }
    double floor = PyFloat_AsDouble(args[2]);
    if (floor == -1.0 && PyErr_Occurred()) return NULL;
    Py_ssize_t qlen = PyBytes_GET_SIZE(query);
    if (qlen % (Py_ssize_t)sizeof(double) != 0) {
        PyErr_SetString(PyExc_ValueError, "admitted: query is not a whole number of doubles");
        return NULL;
    }
    Py_ssize_t dim = qlen / (Py_ssize_t)sizeof(double);
    /* The query copied out once: bytes objects are not guaranteed to be 8-byte aligned. */
    double *q = PyMem_Malloc(dim > 0 ? (size_t)qlen : 1);
    if (q == NULL) return PyErr_NoMemory();
    memcpy(q, PyBytes_AS_STRING(query), (size_t)qlen);

    PyObject *out = PyList_New(0);
    if (out == NULL) goto fail;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2) {
            PyErr_SetString(PyExc_TypeError, "admitted: each row must be (artifact_id, vector)");
            goto fail;
        }
        PyObject *ident = PyTuple_GET_ITEM(row, 0), *blob = PyTuple_GET_ITEM(row, 1);
        if (blob == Py_None) continue;
        if (!PyBytes_Check(blob)) {
            PyErr_SetString(PyExc_TypeError, "admitted: a vector must be bytes or None");
            goto fail;
        }
        if (PyBytes_GET_SIZE(blob) != dim * (Py_ssize_t)sizeof(float)) continue;
        const char *v = PyBytes_AS_STRING(blob);
        double acc = 0.0;
        for (Py_ssize_t i = 0; i < dim; i++) {
            float x;
            memcpy(&x, v + i * (Py_ssize_t)sizeof(float), sizeof x);
            double product = (double)x * q[i];
            acc += product;
        }
        if (!(acc >= floor)) continue;
        PyObject *cos = PyFloat_FromDouble(acc);
        if (cos == NULL) goto fail;
        PyObject *pair = PyTuple_Pack(2, cos, ident);
        Py_DECREF(cos);
        if (pair == NULL) goto fail;
        int err = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (err < 0) goto fail;
    }
    PyMem_Free(q);
    return out;
fail:
    PyMem_Free(q);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"admitted", (PyCFunction)(void (*)(void))admitted, METH_FASTCALL,
     "(cosine, id) of each row whose vector reaches min_cosine against the query."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_vector_native", "The exact vector search's fast path (see store/common.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__vector_native(void) { return PyModule_Create(&module); }
