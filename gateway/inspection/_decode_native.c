/* The encoded-run finder's fast path (gateway/inspection/decoders.py).
 *
 * Two functions, each the exact counterpart of a pure-Python function in decoders.py,
 * which stays the reference (tests/test_decode_native.py checks them against each other):
 *
 *   run_decodings(data: bytes) -> list[tuple[int, bytes]]
 *       decoders.run_decodings: for every maximal run of the base64 alphabet
 *       [A-Za-z0-9+/_-] of at least 12 bytes (with up to two '=' after it), the base64 or
 *       base64url decoding when the run mixes letter cases (or has no letters), then every
 *       maximal hex run of at least 16 digits inside it when the run is not letters only.
 *
 *   trigger_segments(buf: bytes) -> list[tuple[int, int]]
 *       decoders.trigger_segments: (start, end) of every NUL-separated segment of `buf`
 *       holding a percent escape, an HTML character reference or a backslash escape
 *       (decoders.TEXT_TRIGGER).
 *
 * Pure: no state, no I/O, the GIL held throughout (the inputs are immutable bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MIN_B64_RUN 12
#define MIN_HEX_RUN 16

enum {
    C_B64 = 1,    /* [A-Za-z0-9+/_-] */
    C_HEX = 2,    /* [0-9A-Fa-f] */
    C_LOWER = 4,  /* [a-z] */
    C_UPPER = 8,  /* [A-Z] */
    C_DIGIT = 16, /* [0-9] */
    C_STD = 32,   /* + / */
    C_URL = 64,   /* - _ */
};

static uint8_t cls[256];
static int8_t b64val[256];

static void init_tables(void) {
    memset(b64val, -1, sizeof b64val);
    for (int c = 'a'; c <= 'z'; c++) cls[c] |= C_B64 | C_LOWER;
    for (int c = 'A'; c <= 'Z'; c++) cls[c] |= C_B64 | C_UPPER;
    for (int c = '0'; c <= '9'; c++) cls[c] |= C_B64 | C_HEX | C_DIGIT;
    for (int c = 'a'; c <= 'f'; c++) cls[c] |= C_HEX;
    for (int c = 'A'; c <= 'F'; c++) cls[c] |= C_HEX;
    cls['+'] |= C_B64 | C_STD;
    cls['/'] |= C_B64 | C_STD;
    cls['-'] |= C_B64 | C_URL;
    cls['_'] |= C_B64 | C_URL;
    for (int i = 0; i < 26; i++) {
        b64val['A' + i] = (int8_t)i;
        b64val['a' + i] = (int8_t)(26 + i);
    }
    for (int i = 0; i < 10; i++) b64val['0' + i] = (int8_t)(52 + i);
    b64val['+'] = b64val['-'] = 62;
    b64val['/'] = b64val['_'] = 63;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

/* Append (offset, bytes) to `out`; steals nothing. Returns -1 on error. */
static int append_pair(PyObject *out, Py_ssize_t offset, PyObject *bytes) {
    if (bytes == NULL) return -1;
    PyObject *pos = PyLong_FromSsize_t(offset);
    if (pos == NULL) {
        Py_DECREF(bytes);
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, pos, bytes);
    Py_DECREF(pos);
    Py_DECREF(bytes);
    if (pair == NULL) return -1;
    int rc = PyList_Append(out, pair);
    Py_DECREF(pair);
    return rc;
}

/* base64 (or base64url) of body[0:n], n % 4 != 1, alphabet-only: never fails; the bits
 * of an incomplete last group are dropped, as binascii does. */
static PyObject *decode_b64(const unsigned char *body, Py_ssize_t n) {
    PyObject *result = PyBytes_FromStringAndSize(NULL, n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0));
    if (result == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(result);
    uint32_t acc = 0;
    int bits = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        acc = (acc << 6) | (uint32_t)b64val[body[i]];
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            *w++ = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    return result;
}

static PyObject *decode_hex(const unsigned char *digits, Py_ssize_t n) {
    n &= ~(Py_ssize_t)1; /* an odd last digit carries no whole byte */
    PyObject *result = PyBytes_FromStringAndSize(NULL, n / 2);
    if (result == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i += 2) *w++ = (unsigned char)(hexval(digits[i]) << 4 | hexval(digits[i + 1]));
    return result;
}

/* One base64-alphabet run data[start:end] (end includes any '=' after it). */
static int decode_run(PyObject *out, const unsigned char *data, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t body_end = end;
    while (body_end > start && data[body_end - 1] == '=') body_end--;
    uint8_t seen = 0;
    for (Py_ssize_t i = start; i < body_end; i++) seen |= cls[data[i]];
    int one_case = ((seen & C_LOWER) != 0) != ((seen & C_UPPER) != 0);
    if (!one_case && !((seen & C_STD) && (seen & C_URL))) {
        Py_ssize_t n = body_end - start;
        if (n % 4 == 1) n--;
        if (n > 0 && append_pair(out, start, decode_b64(data + start, n)) < 0) return -1;
    }
    /* hex inside: only when the run is not letters alone ('=' is not a letter) */
    int letters_only = body_end == end && (seen & (C_DIGIT | C_STD | C_URL)) == 0;
    if (end - start >= MIN_HEX_RUN && !letters_only) {
        Py_ssize_t i = start;
        while (i < end) {
            if (!(cls[data[i]] & C_HEX)) {
                i++;
                continue;
            }
            Py_ssize_t j = i;
            while (j < end && (cls[data[j]] & C_HEX)) j++;
            if (j - i >= MIN_HEX_RUN && append_pair(out, i, decode_hex(data + i, j - i)) < 0) return -1;
            i = j;
        }
    }
    return 0;
}

static PyObject *run_decodings(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "run_decodings() takes bytes");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t i = 0;
    while (i < size) {
        if (!(cls[data[i]] & C_B64)) {
            i++;
            continue;
        }
        Py_ssize_t j = i;
        while (j < size && (cls[data[j]] & C_B64)) j++;
        if (j - i >= MIN_B64_RUN) {
            Py_ssize_t end = j;
            while (end < size && end - j < 2 && data[end] == '=') end++;
            if (decode_run(out, data, i, end) < 0) {
                Py_DECREF(out);
                return NULL;
            }
            j = end;
        }
        i = j;
    }
    return out;
}

static int is_alpha(unsigned char c) { return (cls[c] & (C_LOWER | C_UPPER)) != 0; }

static int is_alnum(unsigned char c) { return (cls[c] & (C_LOWER | C_UPPER | C_DIGIT)) != 0; }

static int is_hex(unsigned char c) { return (cls[c] & C_HEX) != 0; }

/* Does a TEXT_TRIGGER match start at data[i]? */
static int trigger_at(const unsigned char *data, Py_ssize_t i, Py_ssize_t size) {
    Py_ssize_t left = size - i - 1;
    const unsigned char *p = data + i + 1;
    switch (data[i]) {
        case '%':
            return left >= 2 && is_hex(p[0]) && is_hex(p[1]);
        case '&':
            if (left >= 2 && p[0] == '#') return (p[1] >= '0' && p[1] <= '9') || (left >= 3 && (p[1] == 'x' || p[1] == 'X') && is_hex(p[2]));
            if (left >= 1 && is_alpha(p[0])) {
                Py_ssize_t k = 1;
                while (k < left && k <= 32 && is_alnum(p[k])) k++;
                return k >= 2 && k <= 32 && k < left && p[k] == ';';
            }
            return 0;
        case '\\':
            if (left >= 1 && (p[0] == 'x' || p[0] == 'u' || p[0] == 'U')) return 1;
            return left >= 3 && p[0] >= '0' && p[0] <= '7' && p[1] >= '0' && p[1] <= '7' && p[2] >= '0' && p[2] <= '7';
        default:
            return 0;
    }
}

static PyObject *trigger_segments(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "trigger_segments() takes bytes");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t start = 0;
    Py_ssize_t i = 0;
    while (i < size) {
        unsigned char c = data[i];
        if (c == 0) {
            start = ++i;
            continue;
        }
        if ((c == '%' || c == '&' || c == '\\') && trigger_at(data, i, size)) {
            const unsigned char *nul = memchr(data + i, 0, (size_t)(size - i));
            Py_ssize_t end = nul ? (Py_ssize_t)(nul - data) : size;
            PyObject *pair = Py_BuildValue("(nn)", start, end);
            if (pair == NULL || PyList_Append(out, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(pair);
            i = end; /* the next segment, if any, starts after this NUL */
            continue;
        }
        i++;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"run_decodings", run_decodings, METH_O, "(offset, decoded bytes) for every base64/base64url and hex run."},
    {"trigger_segments", trigger_segments, METH_O, "(start, end) of every NUL-separated segment with a text trigger."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode_native", "The encoded-run finder's fast path (see decoders.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__decode_native(void) {
    init_tables();
    return PyModule_Create(&module);
}
