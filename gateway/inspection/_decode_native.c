/* The encoded-run finder's fast path (gateway/inspection/decoders.py).
 *
 * Functions, each the exact counterpart of a pure-Python function in decoders.py,
 * which stays the reference (tests/test_decode_native.py checks them against each other):
 *
 *   run_decodings(data: bytes) -> list[tuple[int, bytes]]
 *       decoders.run_decodings: for every maximal run of the base64 alphabet
 *       [A-Za-z0-9+/_-] of at least 11 bytes (with up to two '=' after it), its decoding
 *       ('-' and '_' read as '+' and '/') when the run mixes letter cases (or has no
 *       letters), then every maximal hex run of at least 16 digits inside it when the run
 *       is not letters only; after all runs, each hex run of more than 16 digits again
 *       from its second digit, then each decoded run again from its second character
 *       (run by run), then from its third, then from its fourth, while at least 11
 *       characters are left.
 *
 *   trigger_segments(buf: bytes) -> list[tuple[int, int]]
 *       decoders.trigger_segments: (start, end) of every NUL-separated segment of `buf`
 *       holding a percent escape, an HTML character reference or a backslash escape
 *       (decoders.TEXT_TRIGGER).
 *
 *   invisible_flags(text: str) -> int
 *       decoders.invisible_flags: 1 when the text holds a character of decoders._INVISIBLE
 *       (whose ranges configure_invisible hands over at import), 3 when one of them is a
 *       tag character.
 *
 *   fold_forms(text: str) -> str
 *       decoders.fold_forms: every character of decoders._LOOKALIKE (whose pairs
 *       configure_forms hands over at import) replaced by the ASCII character it reads as.
 *
 *   text_flags(text: str) -> int
 *       decoders.text_flags: invisible_flags' bits, 4 when the text holds a character of
 *       decoders._MARK_OR_FORM (whose BMP ranges configure_marks hands over at import) and 8
 *       when it holds one of decoders._LOOKALIKE.
 *
 *   ascii_forms(encoded: list[bytes]) -> (list[bytes | None], list[bytes | None])
 *       decoders.ascii_forms: each ASCII text's normalised copy and that copy squeezed.
 *
 * Pure: no I/O; the only state is the class handed over once at import. The GIL is held
 * throughout (the inputs are immutable).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MIN_B64_RUN 11
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

/* base64 of body[0:n] (any length), as decoders._b64: a dangling last character dropped. */
static int append_b64(PyObject *out, Py_ssize_t offset, const unsigned char *body, Py_ssize_t n) {
    if (n % 4 == 1) n--;
    if (n <= 0) return 0;
    return append_pair(out, offset, decode_b64(body, n));
}

/* One base64-alphabet run data[start:end] (end includes any '=' after it): its decoding
 * from the first character and its hex runs (onto `out`), each hex run of more than
 * MIN_HEX_RUN digits from its second digit (onto `shifted`, which the caller appends after
 * all runs). Sets *b64_end to where the alphabet ends when
 * the run is decoded as base64 (the caller decodes it again at the other alignments while
 * MIN_B64_RUN characters are left), to `start` when it is not. */
static int decode_run(PyObject *out, PyObject *shifted, const unsigned char *data, Py_ssize_t start, Py_ssize_t end,
                      Py_ssize_t *b64_end) {
    Py_ssize_t body_end = end;
    while (body_end > start && data[body_end - 1] == '=') body_end--;
    uint8_t seen = 0;
    for (Py_ssize_t i = start; i < body_end; i++) seen |= cls[data[i]];
    int one_case = ((seen & C_LOWER) != 0) != ((seen & C_UPPER) != 0);
    *b64_end = start;
    if (!one_case) {
        if (append_b64(out, start, data + start, body_end - start) < 0) return -1;
        *b64_end = body_end;
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
            /* from its second digit too (a value behind an odd number of hex digits), after all runs */
            if (j - i > MIN_HEX_RUN && append_pair(shifted, i + 1, decode_hex(data + i + 1, j - i - 1)) < 0) return -1;
            i = j;
        }
    }
    return 0;
}

/* The bytes argument of `fn`, as a pointer and a size; 0 (TypeError set) when it is not bytes. */
static int bytes_arg(PyObject *arg, const char *fn, const unsigned char **data, Py_ssize_t *size) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s() takes bytes", fn);
        return 0;
    }
    *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    *size = PyBytes_GET_SIZE(arg);
    return 1;
}

static PyObject *run_decodings(PyObject *self, PyObject *arg) {
    const unsigned char *data;
    Py_ssize_t size;
    if (!bytes_arg(arg, "run_decodings", &data, &size)) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyObject *shifted = PyList_New(0);
    if (shifted == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    /* (start, end of the alphabet) of every run decoded as base64 and longer than MIN_B64_RUN,
     * for the other alignments */
    Py_ssize_t *spans = NULL, count = 0, room = 0;
    Py_ssize_t i = 0;
    while (i < size) {
        if (!(cls[data[i]] & C_B64)) {
            i++;
            continue;
        }
        Py_ssize_t j = i;
        while (j < size && (cls[data[j]] & C_B64)) j++;
        if (j - i >= MIN_B64_RUN) {
            Py_ssize_t end = j, b64_end;
            while (end < size && end - j < 2 && data[end] == '=') end++;
            if (decode_run(out, shifted, data, i, end, &b64_end) < 0) goto fail;
            if (b64_end - i > MIN_B64_RUN) {
                if (count == room) {
                    room = room ? 2 * room : 64;
                    Py_ssize_t *grown = PyMem_Realloc(spans, (size_t)room * 2 * sizeof *spans);
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        goto fail;
                    }
                    spans = grown;
                }
                spans[2 * count] = i;
                spans[2 * count + 1] = b64_end;
                count++;
            }
            j = end;
        }
        i = j;
    }
    if (PyList_SetSlice(out, PyList_GET_SIZE(out), PyList_GET_SIZE(out), shifted) < 0) goto fail;
    Py_CLEAR(shifted);
    for (Py_ssize_t skip = 1; skip <= 3; skip++)
        for (Py_ssize_t k = 0; k < count; k++) {
            Py_ssize_t start = spans[2 * k] + skip, n = spans[2 * k + 1] - start;
            if (n >= MIN_B64_RUN && append_b64(out, start, data + start, n) < 0) goto fail;
        }
    PyMem_Free(spans);
    return out;
fail:
    PyMem_Free(spans);
    Py_XDECREF(shifted);
    Py_DECREF(out);
    return NULL;
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
    const unsigned char *data;
    Py_ssize_t size;
    if (!bytes_arg(arg, "trigger_segments", &data, &size)) return NULL;
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

/* --- invisible characters ------------------------------------------------------------ */

/* decoders._INVISIBLE as a bitmap over the BMP plus ranges above it, handed over once by
 * configure_invisible(ranges) so the class has one definition (decoders.py). */
static uint8_t invisible_bmp[0x10000 / 8];
static Py_UCS4 astral_lo[32], astral_hi[32];
static int astral_count = -1; /* -1: not configured */

#define TAG_LO 0xE0020
#define TAG_HI 0xE007E

static PyObject *configure_invisible(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "configure_invisible() takes a sequence of (lo, hi) pairs");
    if (seq == NULL) return NULL;
    memset(invisible_bmp, 0, sizeof invisible_bmp);
    int count = 0;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        unsigned long lo, hi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "kk", &lo, &hi)) goto fail;
        if (lo > hi || hi > 0x10FFFF) {
            PyErr_SetString(PyExc_ValueError, "a range must satisfy lo <= hi <= 0x10FFFF");
            goto fail;
        }
        for (unsigned long c = lo; c <= hi && c < 0x10000; c++) invisible_bmp[c >> 3] |= (uint8_t)(1u << (c & 7));
        if (hi >= 0x10000) {
            if (count == 32) {
                PyErr_SetString(PyExc_ValueError, "too many ranges above the BMP");
                goto fail;
            }
            astral_lo[count] = (Py_UCS4)(lo < 0x10000 ? 0x10000 : lo);
            astral_hi[count] = (Py_UCS4)hi;
            count++;
        }
    }
    Py_DECREF(seq);
    astral_count = count;
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    astral_count = -1;
    return NULL;
}

static inline int invisible(Py_UCS4 c) {
    if (c < 0x10000) return (invisible_bmp[c >> 3] >> (c & 7)) & 1;
    for (int k = 0; k < astral_count; k++)
        if (c >= astral_lo[k] && c <= astral_hi[k]) return 1;
    return 0;
}

/* --- look-alike letters, digits and dashes (decoders._FORMS) ------------------------------ */

/* The table decoders._LOOKALIKE maps (a code point to one ASCII character), handed over once
 * by configure_forms(pairs) as (code point, ASCII code) pairs sorted by code point: its BMP
 * part as a direct table (0: not there), the rest as sorted arrays. */
static Py_UCS4 *form_keys = NULL;
static Py_UCS1 *form_values = NULL;
static Py_ssize_t form_count = -1;
static Py_UCS1 form_bmp[0x10000];

static PyObject *configure_forms(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "configure_forms() takes a sequence of (code point, ASCII code) pairs");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_UCS4 *keys = PyMem_Malloc(sizeof(Py_UCS4) * (size_t)(n ? n : 1));
    Py_UCS1 *values = PyMem_Malloc((size_t)(n ? n : 1));
    if (keys == NULL || values == NULL) {
        PyMem_Free(keys);
        PyMem_Free(values);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_UCS1 *bmp = PyMem_Calloc(0x10000, 1);
    if (bmp == NULL) {
        PyMem_Free(keys);
        PyMem_Free(values);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned long cp, to;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "kk", &cp, &to)) goto fail;
        if (cp < 0x80 || cp > 0x10FFFF || to == 0 || to >= 0x80 || (k > 0 && cp <= keys[k - 1])) {
            PyErr_SetString(PyExc_ValueError, "pairs must be sorted non-ASCII code points, each to an ASCII code");
            goto fail;
        }
        keys[k] = (Py_UCS4)cp;
        values[k] = (Py_UCS1)to;
        if (cp <= 0xFFFF) bmp[cp] = (Py_UCS1)to;
    }
    Py_DECREF(seq);
    PyMem_Free(form_keys);
    PyMem_Free(form_values);
    form_keys = keys;
    form_values = values;
    memcpy(form_bmp, bmp, 0x10000);
    PyMem_Free(bmp);
    form_count = n;
    Py_RETURN_NONE;
fail:
    PyMem_Free(bmp);
    PyMem_Free(keys);
    PyMem_Free(values);
    Py_DECREF(seq);
    return NULL;
}

/* The ASCII character `c` reads as, or 0. */
static inline Py_UCS1 form_of(Py_UCS4 c) {
    if (c <= 0xFFFF) return form_bmp[c];
    Py_ssize_t lo = 0, hi = form_count - 1;
    while (lo <= hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (form_keys[mid] == c) return form_values[mid];
        if (form_keys[mid] < c) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

/* fold_forms(text) -> str: `text` with every character of the table replaced by the ASCII
 * character it reads as (decoders._fold_forms); `text` itself when none is there. */
static PyObject *fold_forms(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "fold_forms() takes str");
        return NULL;
    }
    if (form_count < 0) {
        PyErr_SetString(PyExc_RuntimeError, "configure_forms() was not called");
        return NULL;
    }
    int kind = PyUnicode_KIND(arg);
    const void *data = PyUnicode_DATA(arg);
    Py_ssize_t n = PyUnicode_GET_LENGTH(arg);
    int changed = 0;
    Py_UCS4 maxchar = 0;  /* of the result: a str is always built in its narrowest kind */
    if (PyUnicode_MAX_CHAR_VALUE(arg) >= 0x80) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            Py_UCS1 to = form_of(c);
            if (to) {
                changed = 1;
                c = to;
            }
            if (c > maxchar) maxchar = c;
        }
    }
    if (!changed) {
        Py_INCREF(arg);
        return arg;
    }
    PyObject *out = PyUnicode_New(n, maxchar);
    if (out == NULL) return NULL;
    int out_kind = PyUnicode_KIND(out);
    void *out_data = PyUnicode_DATA(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        Py_UCS1 to = form_of(c);
        PyUnicode_WRITE(out_kind, out_data, i, to ? (Py_UCS4)to : c);
    }
    return out;
}

/* decoders._MARK_OR_FORM's BMP part as a bitmap, handed over once by configure_marks(ranges);
 * every character above the BMP belongs to the class too (decoders judges each alone). */
static uint8_t markform_bmp[0x10000 / 8];
static int marks_configured = 0;

static PyObject *configure_marks(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "configure_marks() takes a sequence of (lo, hi) pairs");
    if (seq == NULL) return NULL;
    marks_configured = 0;
    memset(markform_bmp, 0, sizeof markform_bmp);
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        unsigned long lo, hi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "kk", &lo, &hi)) goto fail;
        if (lo > hi || hi > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "a range must satisfy lo <= hi <= 0xFFFF");
            goto fail;
        }
        for (unsigned long c = lo; c <= hi; c++) markform_bmp[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
    Py_DECREF(seq);
    marks_configured = 1;
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    memset(markform_bmp, 0, sizeof markform_bmp);
    return NULL;
}

static inline int markform(Py_UCS4 c) { return c >= 0x10000 || ((markform_bmp[c >> 3] >> (c & 7)) & 1); }

/* The flags of `text` (1: an invisible character, 2 more: a tag character; with `marks`, 4:
 * a character of decoders._MARK_OR_FORM, 8: one of decoders._LOOKALIKE), in one pass that stops once every bit the string's
 * width allows is known (Latin-1 holds no tag, mark or form; the BMP no tag). */
static PyObject *scan_flags(PyObject *arg, int marks, const char *name) {
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s() takes str", name);
        return NULL;
    }
    if (astral_count < 0 || (marks && (!marks_configured || form_count < 0))) {
        PyErr_SetString(PyExc_RuntimeError, "configure_invisible(), configure_marks() or configure_forms() was not called");
        return NULL;
    }
    int kind = PyUnicode_KIND(arg);
    const void *data = PyUnicode_DATA(arg);
    Py_ssize_t n = PyUnicode_GET_LENGTH(arg);
    long flags = 0;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *p = data;
        for (Py_ssize_t i = 0; i < n && !flags; i++)
            if (invisible(p[i])) flags = 1;
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *p = data;
        long all = marks ? 13 : 1;
        for (Py_ssize_t i = 0; i < n && flags != all; i++) {
            if (invisible(p[i])) flags |= 1;
            if (marks && markform(p[i])) flags |= 4;
            if (marks && form_of(p[i])) flags |= 8;
        }
    } else {
        const Py_UCS4 *p = data;
        long all = marks ? 15 : 3;
        for (Py_ssize_t i = 0; i < n && flags != all; i++) {
            Py_UCS4 c = p[i];
            if (invisible(c)) flags |= (c >= TAG_LO && c <= TAG_HI) ? 3 : 1;
            if (marks && markform(c)) flags |= 4;
            if (marks && form_of(c)) flags |= 8;
        }
    }
    return PyLong_FromLong(flags);
}

/* invisible_flags(text) -> int: 1 when `text` holds a character of the class, 2 more when it
 * holds a tag character (U+E0020-U+E007E). */
static PyObject *invisible_flags(PyObject *self, PyObject *arg) { return scan_flags(arg, 0, "invisible_flags"); }

/* text_flags(text) -> int: invisible_flags' bits, 4 when the text holds a character of
 * decoders._MARK_OR_FORM and 8 when it holds one of decoders._LOOKALIKE. */
static PyObject *text_flags(PyObject *self, PyObject *arg) { return scan_flags(arg, 1, "text_flags"); }

/* --- ASCII units' normalised and squeezed copies --------------------------------------- */

/* ASCII controls that normalising removes (decoders._ASCII_INVISIBLE_BYTES), and those
 * plus the whitespace controls, which squeezing removes too (_WHITESPACE_CONTROL_BYTES). */
static uint8_t drop_invisible[256], drop_whitespace[256];

static void init_drop_tables(void) {
    for (int c = 0; c < 0x20; c++) drop_invisible[c] = !(c >= 0x09 && c <= 0x0D);
    drop_invisible[0x7F] = 1;
    for (int c = 0x09; c <= 0x0D; c++) drop_whitespace[c] = 1;
}

static int all_ascii(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ull) return 0;
    }
    for (; i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

/* `data` without the bytes `drop` marks; `data` itself (a new reference) when none is. */
static PyObject *without(PyObject *data, const uint8_t *drop) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    Py_ssize_t first = 0;
    while (first < n && !drop[p[first]]) first++;
    if (first == n) return Py_NewRef(data);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(w, p, (size_t)first);
    Py_ssize_t k = first;
    for (Py_ssize_t i = first; i < n; i++) {
        w[k] = p[i];
        k += !drop[p[i]];
    }
    if (_PyBytes_Resize(&out, k) < 0) return NULL;
    return out;
}

/* ascii_forms(encoded: list[bytes]) -> (normalised, squeezed): for each ASCII text its
 * normalised copy and that copy squeezed (the same object where nothing is removed);
 * None in both for a text that is not ASCII. */
static PyObject *ascii_forms(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "ascii_forms() takes a list of bytes");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(arg);
    PyObject *normals = PyList_New(count), *squeezeds = PyList_New(count);
    if (normals == NULL || squeezeds == NULL) goto fail;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *data = PyList_GET_ITEM(arg, k);
        const unsigned char *p;
        Py_ssize_t n;
        if (!bytes_arg(data, "ascii_forms", &p, &n)) goto fail;
        if (!all_ascii(p, n)) {
            PyList_SET_ITEM(normals, k, Py_NewRef(Py_None));
            PyList_SET_ITEM(squeezeds, k, Py_NewRef(Py_None));
            continue;
        }
        PyObject *normal = without(data, drop_invisible);
        if (normal == NULL) goto fail;
        PyList_SET_ITEM(normals, k, normal);
        PyObject *squeezed = without(normal, drop_whitespace);
        if (squeezed == NULL) goto fail;
        PyList_SET_ITEM(squeezeds, k, squeezed);
    }
    return Py_BuildValue("(NN)", normals, squeezeds);
fail:
    Py_XDECREF(normals);
    Py_XDECREF(squeezeds);
    return NULL;
}

static PyMethodDef methods[] = {
    {"run_decodings", run_decodings, METH_O, "(offset, decoded bytes) for every base64/base64url and hex run."},
    {"trigger_segments", trigger_segments, METH_O, "(start, end) of every NUL-separated segment with a text trigger."},
    {"configure_invisible", configure_invisible, METH_O, "Hand over decoders' invisible-character ranges."},
    {"invisible_flags", invisible_flags, METH_O, "1: the text holds an invisible character; 2 more: a tag character."},
    {"configure_marks", configure_marks, METH_O, "Hand over the BMP part of decoders' mark-or-form class."},
    {"text_flags", text_flags, METH_O, "invisible_flags, and 4 when the text holds a mark or parenthesised form."},
    {"ascii_forms", ascii_forms, METH_O, "The normalised and squeezed copies of ASCII texts (None for others)."},
    {"configure_forms", configure_forms, METH_O, "Hand over decoders' look-alike table as sorted pairs."},
    {"fold_forms", fold_forms, METH_O, "The text with every look-alike character read as its ASCII one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode_native", "The encoded-run finder's fast path (see decoders.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__decode_native(void) {
    init_tables();
    init_drop_tables();
    return PyModule_Create(&module);
}
