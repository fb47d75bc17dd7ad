/* Native path of the strict raw JSON reader (gateway/carriers/jsonraw.py).
 *
 * Same results as the pure-Python reference in jsonraw.py, which stays the specification:
 * the same document (dict, DupDict with `shadowed`, list, str, int, JsonFloat holding the
 * exact lexeme, True/False/None), the same units in the same order with the same paths, the
 * same JsonError reason codes with the same precedence:
 *
 *   1. invalid UTF-8 anywhere in wire bytes                     -> json_invalid
 *   2. the first syntax error, in document order                -> json_invalid
 *      (NaN/Infinity, integers past the interpreter's digit limit included);
 *      nesting past the interpreter's recursion budget, met first -> too_deep
 *   3. a lone surrogate escape (wire bytes only)                 -> json_invalid
 *   4. a container nested deeper than max_depth                  -> too_deep
 *   (3 and 4 swap for loads(check_depth=True), as in the reference.)
 *
 * Pure: no I/O. The types, reason codes and kinds come from jsonraw via configure().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *JsonError = NULL;
static PyTypeObject *DupDictType = NULL;
static PyObject *JsonFloatType = NULL;
static PyTypeObject *TextUnitType = NULL;
static PyObject *R_INVALID = NULL, *R_TOO_DEEP = NULL;
static PyObject *K_STRING = NULL, *K_KEY = NULL, *K_NUMBER = NULL;
static PyObject *S_SHADOWED = NULL;

/* ---------------------------------------------------------------- UTF-8 (strict) ---- */

/* Exactly what bytes.decode("utf-8") accepts: no overlongs, no encoded surrogates, nothing
 * past U+10FFFF, no truncated sequence. */
static int
utf8_valid(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
        }
        else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;  /* overlong */
            if (c == 0xED && c1 >= 0xA0) return 0; /* surrogate */
            i += 3;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;  /* overlong */
            if (c == 0xF4 && c1 >= 0x90) return 0; /* past U+10FFFF */
            i += 4;
        }
        else {
            return 0;
        }
    }
    return 1;
}

/* ---------------------------------------------------------------- parser ------------ */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    int depth;     /* containers open now */
    int max_depth; /* deepest container seen (top level = 1) */
    int lone;      /* a lone surrogate was decoded from an escape */
    int dups;      /* some object had duplicate keys */
    int syntax;    /* a syntax error (no Python exception set) */
    PyObject *memo; /* key text -> the one str object for it */
    PyObject **pairs; /* key, value, key, value, ... of the objects being read (owned) */
    Py_ssize_t npairs, cappairs;
    char *buf; /* scratch for strings with escapes */
    Py_ssize_t capbuf;
} Parser;

static PyObject *parse_value(Parser *s);

static PyObject *
syntax(Parser *s)
{
    s->syntax = 1;
    return NULL;
}

static inline void
skip_ws(Parser *s)
{
    const unsigned char *p = s->p, *end = s->end;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    s->p = p;
}

static int
buf_reserve(Parser *s, Py_ssize_t need)
{
    if (need <= s->capbuf) return 0;
    Py_ssize_t cap = s->capbuf ? s->capbuf : 256;
    while (cap < need) cap *= 2;
    char *nb = PyMem_Realloc(s->buf, (size_t)cap);
    if (nb == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->buf = nb;
    s->capbuf = cap;
    return 0;
}

static int
hex4(const unsigned char *p, Py_UCS4 *out)
{
    Py_UCS4 c = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char d = p[i];
        c <<= 4;
        if (d >= '0' && d <= '9') c |= (Py_UCS4)(d - '0');
        else if (d >= 'a' && d <= 'f') c |= (Py_UCS4)(d - 'a' + 10);
        else if (d >= 'A' && d <= 'F') c |= (Py_UCS4)(d - 'A' + 10);
        else return -1;
    }
    *out = c;
    return 0;
}

/* Append code point c as UTF-8 (surrogates in their 3-byte "surrogatepass" form). */
static Py_ssize_t
put_utf8(char *o, Py_UCS4 c)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* s->p is just past the opening quote. Rules of json's strict scanner: no raw character
 * below U+0020, the eight short escapes and \uXXXX; a high-surrogate escape followed by a
 * low-surrogate escape is one code point, any other surrogate escape is kept alone (and
 * flagged). */
static PyObject *
parse_string(Parser *s, int is_key)
{
    const unsigned char *p = s->p, *end = s->end, *start = p;
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
    if (p >= end || *p < 0x20) return syntax(s);
    PyObject *str;
    if (*p == '"') {
        str = PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
        s->p = p + 1;
    }
    else {
        /* every escape yields at most as many UTF-8 bytes as it takes in the source */
        Py_ssize_t n = p - start;
        if (buf_reserve(s, n + 64) < 0) return NULL;
        memcpy(s->buf, start, (size_t)n);
        for (;;) {
            if (p >= end) return syntax(s);
            unsigned char c = *p;
            if (c == '"') break;
            if (c < 0x20) return syntax(s);
            if (buf_reserve(s, n + 8) < 0) return NULL;
            if (c != '\\') {
                s->buf[n++] = (char)c;
                p++;
                continue;
            }
            if (p + 1 >= end) return syntax(s);
            unsigned char e = p[1];
            p += 2;
            switch (e) {
            case '"': s->buf[n++] = '"'; break;
            case '\\': s->buf[n++] = '\\'; break;
            case '/': s->buf[n++] = '/'; break;
            case 'b': s->buf[n++] = '\b'; break;
            case 'f': s->buf[n++] = '\f'; break;
            case 'n': s->buf[n++] = '\n'; break;
            case 'r': s->buf[n++] = '\r'; break;
            case 't': s->buf[n++] = '\t'; break;
            case 'u': {
                Py_UCS4 u;
                if (end - p < 4 || hex4(p, &u) < 0) return syntax(s);
                p += 4;
                if (u >= 0xD800 && u <= 0xDBFF && end - p > 6 && p[0] == '\\' && p[1] == 'u') {
                    Py_UCS4 u2;
                    if (hex4(p + 2, &u2) < 0) return syntax(s);
                    if (u2 >= 0xDC00 && u2 <= 0xDFFF) {
                        u = 0x10000 + (((u - 0xD800) << 10) | (u2 - 0xDC00));
                        p += 6;
                    }
                }
                if (u >= 0xD800 && u <= 0xDFFF) s->lone = 1;
                n += put_utf8(s->buf + n, u);
                break;
            }
            default:
                return syntax(s);
            }
        }
        str = PyUnicode_DecodeUTF8(s->buf, n, "surrogatepass");
        s->p = p + 1;
    }
    if (str == NULL || !is_key) return str;
    PyObject *same = PyDict_SetDefault(s->memo, str, str);
    Py_XINCREF(same);
    Py_DECREF(str);
    return same;
}

static PyObject *
parse_number(Parser *s)
{
    const unsigned char *p = s->p, *end = s->end, *start = p;
    int is_float = 0;
    if (*p == '-') p++;
    if (p < end && *p >= '1' && *p <= '9') {
        p++;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    else if (p < end && *p == '0') {
        p++;
    }
    else {
        return syntax(s);
    }
    if (p + 1 < end && *p == '.' && p[1] >= '0' && p[1] <= '9') {
        is_float = 1;
        p += 2;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        const unsigned char *q = p + 1;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q < end && *q >= '0' && *q <= '9') {
            while (q < end && *q >= '0' && *q <= '9') q++;
            is_float = 1;
            p = q;
        }
    }
    s->p = p;
    Py_ssize_t n = p - start;
    if (is_float) {
        PyObject *lexeme = PyUnicode_DecodeASCII((const char *)start, n, NULL);
        if (lexeme == NULL) return NULL;
        PyObject *f = PyObject_CallOneArg(JsonFloatType, lexeme);
        Py_DECREF(lexeme);
        return f;
    }
    if (n <= 18) {
        long long v = 0;
        const unsigned char *d = start[0] == '-' ? start + 1 : start;
        for (; d < p; d++) v = v * 10 + (*d - '0');
        return PyLong_FromLongLong(start[0] == '-' ? -v : v);
    }
    /* PyLong_FromString, as json does: the interpreter's digit limit applies (ValueError) */
    char *digits = PyMem_Malloc((size_t)n + 1);
    if (digits == NULL) return PyErr_NoMemory();
    memcpy(digits, start, (size_t)n);
    digits[n] = '\0';
    PyObject *v = PyLong_FromString(digits, NULL, 10);
    PyMem_Free(digits);
    return v;
}

static int
push_pair(Parser *s, PyObject *key, PyObject *value)
{
    if (s->npairs + 2 > s->cappairs) {
        Py_ssize_t cap = s->cappairs ? s->cappairs * 2 : 64;
        PyObject **np = PyMem_Realloc(s->pairs, (size_t)cap * sizeof(PyObject *));
        if (np == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->pairs = np;
        s->cappairs = cap;
    }
    s->pairs[s->npairs++] = key;
    s->pairs[s->npairs++] = value;
    return 0;
}

static void
drop_pairs(Parser *s, Py_ssize_t base)
{
    while (s->npairs > base) {
        s->npairs--;
        Py_DECREF(s->pairs[s->npairs]);
    }
}

/* The object of the pairs from `base` on, as _pairs_hook builds it: a dict holding the last
 * value of every key, or a DupDict whose `shadowed` lists every earlier value in order. */
static PyObject *
build_object(Parser *s, Py_ssize_t base)
{
    Py_ssize_t count = (s->npairs - base) / 2;
    PyObject *obj = PyDict_New();
    if (obj == NULL) return NULL;
    PyObject **pairs = s->pairs + base;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyDict_SetItem(obj, pairs[2 * i], pairs[2 * i + 1]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    if (PyDict_GET_SIZE(obj) == count) return obj;
    s->dups = 1;
    PyObject *last = PyDict_New(), *shadowed = PyList_New(0), *dup = NULL;
    if (last == NULL || shadowed == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL || PyDict_SetItem(last, pairs[2 * i], index) < 0) {
            Py_XDECREF(index);
            goto done;
        }
        Py_DECREF(index);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *index = PyDict_GetItemWithError(last, pairs[2 * i]);
        if (index == NULL) goto done;
        if (PyLong_AsSsize_t(index) == i) continue;
        PyObject *pair = PyTuple_Pack(2, pairs[2 * i], pairs[2 * i + 1]);
        if (pair == NULL || PyList_Append(shadowed, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
    }
    dup = PyObject_CallFunctionObjArgs((PyObject *)DupDictType, obj, shadowed, NULL);
done:
    Py_XDECREF(last);
    Py_XDECREF(shadowed);
    Py_DECREF(obj);
    return dup;
}

static PyObject *
parse_object(Parser *s)
{
    Py_ssize_t base = s->npairs;
    s->p++; /* { */
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return PyDict_New();
    }
    for (;;) {
        if (s->p >= s->end || *s->p != '"') goto fail_syntax;
        s->p++;
        PyObject *key = parse_string(s, 1);
        if (key == NULL) goto fail;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') {
            Py_DECREF(key);
            goto fail_syntax;
        }
        s->p++;
        skip_ws(s);
        PyObject *value = parse_value(s);
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        if (push_pair(s, key, value) < 0) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        skip_ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            break;
        }
        if (s->p >= s->end || *s->p != ',') goto fail_syntax;
        s->p++;
        skip_ws(s);
    }
    PyObject *obj = build_object(s, base);
    drop_pairs(s, base);
    return obj;
fail_syntax:
    s->syntax = 1;
fail:
    drop_pairs(s, base);
    return NULL;
}

static PyObject *
parse_array(Parser *s)
{
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    s->p++; /* [ */
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return list;
    }
    for (;;) {
        PyObject *value = parse_value(s);
        if (value == NULL) goto fail;
        int rc = PyList_Append(list, value);
        Py_DECREF(value);
        if (rc < 0) goto fail;
        skip_ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return list;
        }
        if (s->p >= s->end || *s->p != ',') {
            s->syntax = 1;
            goto fail;
        }
        s->p++;
        skip_ws(s);
    }
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *
literal(Parser *s, const char *word, Py_ssize_t n, PyObject *value)
{
    if (s->end - s->p < n || memcmp(s->p, word, (size_t)n) != 0) return syntax(s);
    s->p += n;
    return Py_NewRef(value);
}

/* A container opens: json's scanner spends one level of the interpreter's recursion budget
 * here (RecursionError -> too_deep); so does this one. */
static PyObject *
parse_container(Parser *s, int object)
{
    if (Py_EnterRecursiveCall(" while decoding a JSON document")) return NULL;
    s->depth++;
    if (s->depth > s->max_depth) s->max_depth = s->depth;
    PyObject *v = object ? parse_object(s) : parse_array(s);
    s->depth--;
    Py_LeaveRecursiveCall();
    return v;
}

static PyObject *
parse_value(Parser *s)
{
    if (s->p >= s->end) return syntax(s);
    switch (*s->p) {
    case '"':
        s->p++;
        return parse_string(s, 0);
    case '{':
        return parse_container(s, 1);
    case '[':
        return parse_container(s, 0);
    case 'n':
        return literal(s, "null", 4, Py_None);
    case 't':
        return literal(s, "true", 4, Py_True);
    case 'f':
        return literal(s, "false", 5, Py_False);
    default:
        if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) return parse_number(s);
        return syntax(s);
    }
}

static PyObject *
raise_reason(PyObject *reason)
{
    PyObject *exc = PyObject_CallOneArg(JsonError, reason);
    if (exc != NULL) {
        PyErr_SetObject(JsonError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static int
configured(void)
{
    if (JsonError == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_jsonraw_native.configure() was not called");
        return 0;
    }
    return 1;
}

/* Parse a whole document. On failure raises JsonError(json_invalid | too_deep) (or
 * MemoryError) and returns NULL. */
static PyObject *
parse_document(Parser *s, const char *data, Py_ssize_t n)
{
    memset(s, 0, sizeof(*s));
    s->p = (const unsigned char *)data;
    s->end = s->p + n;
    s->memo = PyDict_New();
    if (s->memo == NULL) return NULL;
    skip_ws(s);
    PyObject *doc = parse_value(s);
    if (doc != NULL) {
        skip_ws(s);
        if (s->p != s->end) {
            Py_CLEAR(doc);
            s->syntax = 1;
        }
    }
    drop_pairs(s, 0);
    PyMem_Free(s->pairs);
    PyMem_Free(s->buf);
    Py_CLEAR(s->memo);
    if (doc != NULL) return doc;
    if (s->syntax && !PyErr_Occurred()) return raise_reason(R_INVALID);
    if (PyErr_ExceptionMatches(PyExc_RecursionError)) {
        PyErr_Clear();
        return raise_reason(R_TOO_DEEP);
    }
    if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* the integer digit limit */
        PyErr_Clear();
        return raise_reason(R_INVALID);
    }
    return NULL;
}

/* ---------------------------------------------------------------- walks ------------- */

typedef struct {
    PyObject *items; /* list of TextUnit */
    PyObject *dups;  /* list of paths */
    PyObject *seen;  /* key texts already emitted */
} Walk;

static int
emit(Walk *w, PyObject *path, PyObject *text, PyObject *kind)
{
    PyObject *unit = TextUnitType->tp_alloc(TextUnitType, 3);
    if (unit == NULL) return -1;
    PyTuple_SET_ITEM(unit, 0, Py_NewRef(path));
    PyTuple_SET_ITEM(unit, 1, Py_NewRef(text));
    PyTuple_SET_ITEM(unit, 2, Py_NewRef(kind));
    int rc = PyList_Append(w->items, unit);
    Py_DECREF(unit);
    return rc;
}

static PyObject *
child_path(PyObject *path, PyObject *step)
{
    Py_ssize_t n = PyTuple_GET_SIZE(path);
    PyObject *t = PyTuple_New(n + 1);
    if (t == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(PyTuple_GET_ITEM(path, i)));
    PyTuple_SET_ITEM(t, n, Py_NewRef(step));
    return t;
}

static int visit(Walk *w, PyObject *path, PyObject *node);

static int
visit_child(Walk *w, PyObject *path, PyObject *step, PyObject *value)
{
    PyTypeObject *t = Py_TYPE(value);
    if (value == Py_None || t == &PyBool_Type) return 0; /* nothing to emit: no path needed */
    PyObject *cp = child_path(path, step);
    if (cp == NULL) return -1;
    int rc = visit(w, cp, value);
    Py_DECREF(cp);
    return rc;
}

/* jsonraw.collect, depth first: a string, a number's lexical form; for an object its key
 * texts not seen before, then its members in order, then its shadowed members; for an array
 * its elements in order. (The depth limit was checked while parsing.) */
static int
visit(Walk *w, PyObject *path, PyObject *node)
{
    PyTypeObject *t = Py_TYPE(node);
    if (t == &PyUnicode_Type) return emit(w, path, node, K_STRING);
    if (t == &PyDict_Type || t == DupDictType) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(node, &pos, &key, &value)) {
            int known = PySet_Contains(w->seen, key);
            if (known < 0) return -1;
            if (!known && (PySet_Add(w->seen, key) < 0 || emit(w, path, key, K_KEY) < 0)) return -1;
        }
        if (t == DupDictType && PyList_Append(w->dups, path) < 0) return -1;
        pos = 0;
        while (PyDict_Next(node, &pos, &key, &value)) {
            if (visit_child(w, path, key, value) < 0) return -1;
        }
        if (t == DupDictType) {
            PyObject *shadowed = PyObject_GetAttr(node, S_SHADOWED);
            if (shadowed == NULL) return -1;
            PyObject *seq = PySequence_Fast(shadowed, "shadowed must be a sequence");
            Py_DECREF(shadowed);
            if (seq == NULL) return -1;
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
                PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
                if (visit_child(w, path, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0) {
                    Py_DECREF(seq);
                    return -1;
                }
            }
            Py_DECREF(seq);
        }
        return 0;
    }
    if (t == &PyList_Type) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(node); i++) {
            PyObject *value = PyList_GET_ITEM(node, i);
            PyTypeObject *vt = Py_TYPE(value);
            if (value == Py_None || vt == &PyBool_Type) continue;
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL) return -1;
            int rc = visit_child(w, path, index, value);
            Py_DECREF(index);
            if (rc < 0) return -1;
        }
        return 0;
    }
    if (t == &PyLong_Type || (PyObject *)t == JsonFloatType) {
        PyObject *text = PyObject_Str(node);
        if (text == NULL) return -1;
        int rc = emit(w, path, text, K_NUMBER);
        Py_DECREF(text);
        return rc;
    }
    return 0;
}

/* jsonraw.collect_texts, with the same explicit stack (so the same order). */
static PyObject *
collect_texts(PyObject *doc)
{
    PyObject *texts = PyList_New(0);
    if (texts == NULL) return NULL;
    Py_ssize_t cap = 64, top = 0;
    PyObject **stack = PyMem_Malloc((size_t)cap * sizeof(PyObject *)); /* borrowed from doc */
    PyObject *shadowed = NULL;
    if (stack == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
#define PUSH(v)                                                                          \
    do {                                                                                 \
        if (top == cap) {                                                                \
            PyObject **ns = PyMem_Realloc(stack, (size_t)cap * 2 * sizeof(PyObject *)); \
            if (ns == NULL) {                                                            \
                PyErr_NoMemory();                                                        \
                goto fail;                                                               \
            }                                                                            \
            stack = ns;                                                                  \
            cap *= 2;                                                                    \
        }                                                                                \
        stack[top++] = (v);                                                              \
    } while (0)
    stack[top++] = doc;
    while (top > 0) {
        PyObject *node = stack[--top];
        PyTypeObject *t = Py_TYPE(node);
        if (t == &PyUnicode_Type) {
            if (PyList_Append(texts, node) < 0) goto fail;
        }
        else if (t == &PyDict_Type || t == DupDictType) {
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (PyDict_Next(node, &pos, &key, &value)) {
                if (PyList_Append(texts, key) < 0) goto fail;
                PUSH(value);
            }
            if (t == DupDictType) {
                shadowed = PyObject_GetAttr(node, S_SHADOWED);
                if (shadowed == NULL || !PyList_Check(shadowed)) goto fail;
                for (Py_ssize_t i = 0; i < PyList_GET_SIZE(shadowed); i++) {
                    PUSH(PyTuple_GET_ITEM(PyList_GET_ITEM(shadowed, i), 1)); /* kept alive by node */
                }
                Py_CLEAR(shadowed);
            }
        }
        else if (t == &PyList_Type) {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(node); i++) {
                PyObject *value = PyList_GET_ITEM(node, i);
                PyTypeObject *vt = Py_TYPE(value);
                if (vt == &PyUnicode_Type) {
                    if (PyList_Append(texts, value) < 0) goto fail;
                }
                else if (vt == &PyLong_Type) {
                    PyObject *text = PyObject_Str(value);
                    if (text == NULL || PyList_Append(texts, text) < 0) {
                        Py_XDECREF(text);
                        goto fail;
                    }
                    Py_DECREF(text);
                }
                else if (vt != &PyBool_Type && value != Py_None) {
                    PUSH(value);
                }
            }
        }
        else if (t == &PyLong_Type || (PyObject *)t == JsonFloatType) {
            PyObject *text = PyObject_Str(node);
            if (text == NULL || PyList_Append(texts, text) < 0) {
                Py_XDECREF(text);
                goto fail;
            }
            Py_DECREF(text);
        }
    }
#undef PUSH
    PyMem_Free(stack);
    return texts;
fail:
    Py_XDECREF(shadowed);
    PyMem_Free(stack);
    Py_DECREF(texts);
    return NULL;
}

/* ---------------------------------------------------------------- module functions -- */

static int
wire_bytes(PyObject *raw, const char **data, Py_ssize_t *n)
{
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "expected bytes");
        return -1;
    }
    *data = PyBytes_AS_STRING(raw);
    *n = PyBytes_GET_SIZE(raw);
    if (!utf8_valid((const unsigned char *)*data, *n)) {
        raise_reason(R_INVALID);
        return -1;
    }
    return 0;
}

/* decode_units(raw: bytes, base: tuple, max_depth: int) -> (doc, units, duplicate paths) */
static PyObject *
native_decode_units(PyObject *self, PyObject *args)
{
    PyObject *raw, *base;
    int max_depth;
    if (!configured() || !PyArg_ParseTuple(args, "SO!i", &raw, &PyTuple_Type, &base, &max_depth)) return NULL;
    const char *data;
    Py_ssize_t n;
    if (wire_bytes(raw, &data, &n) < 0) return NULL;
    Parser s;
    PyObject *doc = parse_document(&s, data, n);
    if (doc == NULL) return NULL;
    if (s.lone) {
        Py_DECREF(doc);
        return raise_reason(R_INVALID);
    }
    if (s.max_depth > max_depth) {
        Py_DECREF(doc);
        return raise_reason(R_TOO_DEEP);
    }
    Walk w = {PyList_New(0), PyList_New(0), PySet_New(NULL)};
    PyObject *result = NULL;
    if (w.items != NULL && w.dups != NULL && w.seen != NULL && visit(&w, base, doc) == 0)
        result = PyTuple_Pack(3, doc, w.items, w.dups);
    Py_XDECREF(w.items);
    Py_XDECREF(w.dups);
    Py_XDECREF(w.seen);
    Py_DECREF(doc);
    return result;
}

/* loads(raw: bytes, max_depth: int, check_depth: bool) -> doc */
static PyObject *
native_loads(PyObject *self, PyObject *args)
{
    PyObject *raw;
    int max_depth, check_depth;
    if (!configured() || !PyArg_ParseTuple(args, "Sip", &raw, &max_depth, &check_depth)) return NULL;
    const char *data;
    Py_ssize_t n;
    if (wire_bytes(raw, &data, &n) < 0) return NULL;
    Parser s;
    PyObject *doc = parse_document(&s, data, n);
    if (doc == NULL) return NULL;
    if (check_depth && s.max_depth > max_depth) {
        Py_DECREF(doc);
        return raise_reason(R_TOO_DEEP);
    }
    if (s.lone) {
        Py_DECREF(doc);
        return raise_reason(R_INVALID);
    }
    return doc;
}

/* Text (a str) as UTF-8; NotImplemented when it holds a surrogate (the caller then uses the
 * reference reader). */
static PyObject *
text_document(PyObject *text, int max_depth, Parser *s)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "expected str");
        return NULL;
    }
    Py_ssize_t n;
    const char *data = PyUnicode_AsUTF8AndSize(text, &n);
    if (data == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *doc = parse_document(s, data, n);
    if (doc != NULL && s->max_depth > max_depth) {
        Py_DECREF(doc);
        return raise_reason(R_TOO_DEEP);
    }
    return doc;
}

/* decode_shape(text: str, max_depth: int) -> (doc, had duplicate keys) | NotImplemented */
static PyObject *
native_decode_shape(PyObject *self, PyObject *args)
{
    PyObject *text;
    int max_depth;
    if (!configured() || !PyArg_ParseTuple(args, "Ui", &text, &max_depth)) return NULL;
    Parser s;
    PyObject *doc = text_document(text, max_depth, &s);
    if (doc == NULL || doc == Py_NotImplemented) return doc;
    PyObject *result = Py_BuildValue("(NO)", doc, s.dups ? Py_True : Py_False);
    return result;
}

/* decode_texts(text: str, max_depth: int) -> (doc, texts, had duplicate keys) | NotImplemented */
static PyObject *
native_decode_texts(PyObject *self, PyObject *args)
{
    PyObject *text;
    int max_depth;
    if (!configured() || !PyArg_ParseTuple(args, "Ui", &text, &max_depth)) return NULL;
    Parser s;
    PyObject *doc = text_document(text, max_depth, &s);
    if (doc == NULL || doc == Py_NotImplemented) return doc;
    PyObject *texts = collect_texts(doc);
    if (texts == NULL) {
        Py_DECREF(doc);
        return NULL;
    }
    return Py_BuildValue("(NNO)", doc, texts, s.dups ? Py_True : Py_False);
}

/* ------------------------------------------------------------ SSE (whole streams) ---- */

/* State of sse.SSEParser between lines. */
typedef struct {
    PyObject *cls;    /* SSEEvent */
    PyObject *events; /* list */
    PyObject *event;  /* NULL: None */
    PyObject *id;     /* NULL: None */
    PyObject *data;   /* list of str, NULL: empty */
    int pending;
} SSEState;

static void
sse_reset(SSEState *st)
{
    Py_CLEAR(st->event);
    Py_CLEAR(st->id);
    Py_CLEAR(st->data);
    st->pending = 0;
}

static int
sse_dispatch(SSEState *st)
{
    if (st->data != NULL && PyList_GET_SIZE(st->data) > 0) {
        PyObject *joined;
        if (PyList_GET_SIZE(st->data) == 1) {
            joined = Py_NewRef(PyList_GET_ITEM(st->data, 0));
        } else {
            PyObject *lf = PyUnicode_FromStringAndSize("\n", 1);
            if (lf == NULL) return -1;
            joined = PyUnicode_Join(lf, st->data);
            Py_DECREF(lf);
        }
        if (joined == NULL) return -1;
        PyObject *ev = PyObject_CallFunctionObjArgs(st->cls, st->event ? st->event : Py_None, joined,
                                                    st->id ? st->id : Py_None, NULL);
        Py_DECREF(joined);
        if (ev == NULL) return -1;
        int rc = PyList_Append(st->events, ev);
        Py_DECREF(ev);
        if (rc < 0) return -1;
    }
    sse_reset(st);
    return 0;
}

/* One complete line (without its terminator), exactly as SSEParser._line. */
static int
sse_line(SSEState *st, const char *line, Py_ssize_t n)
{
    if (n == 0) return sse_dispatch(st);
    PyObject *text = PyUnicode_DecodeUTF8(line, n, "strict");
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
        PyErr_Clear();
        raise_reason(R_INVALID);
        return -1;
    }
    if (line[0] == ':') { /* a comment / keep-alive */
        Py_DECREF(text);
        return 0;
    }
    st->pending = 1;
    const char *colon = memchr(line, ':', (size_t)n);
    Py_ssize_t name_len = colon ? colon - line : n;
    PyObject *value;
    if (colon == NULL) {
        value = PyUnicode_FromStringAndSize("", 0);
    } else {
        /* ':' and ' ' are ASCII: their code point index is their byte index only when
         * what precedes them is ASCII, so cut the decoded text by code points. */
        Py_ssize_t at = PyUnicode_FindChar(text, ':', 0, PyUnicode_GET_LENGTH(text), 1);
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        if (at + 1 < len && PyUnicode_READ_CHAR(text, at + 1) == ' ') at++;
        value = PyUnicode_Substring(text, at + 1, len);
    }
    Py_DECREF(text);
    if (value == NULL) return -1;
    if (name_len == 4 && memcmp(line, "data", 4) == 0) {
        if (st->data == NULL && (st->data = PyList_New(0)) == NULL) {
            Py_DECREF(value);
            return -1;
        }
        int rc = PyList_Append(st->data, value);
        Py_DECREF(value);
        return rc;
    }
    if (name_len == 5 && memcmp(line, "event", 5) == 0) {
        Py_XSETREF(st->event, value);
        return 0;
    }
    if (name_len == 2 && memcmp(line, "id", 2) == 0 && PyUnicode_FindChar(value, 0, 0, PyUnicode_GET_LENGTH(value), 1) < 0) {
        Py_XSETREF(st->id, value);
        return 0;
    }
    Py_DECREF(value); /* `retry` and unknown fields are ignored */
    return 0;
}

/* sse_parse_all(data: bytes, SSEEvent) -> (events, ended_cleanly): sse.parse_all. */
static PyObject *
native_sse_parse_all(PyObject *self, PyObject *args)
{
    PyObject *raw, *cls;
    if (!PyArg_ParseTuple(args, "O!O", &PyBytes_Type, &raw, &cls)) return NULL;
    if (!configured()) return NULL;
    const char *buf = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    if (n >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0) { /* one leading byte order mark is ignored */
        buf += 3;
        n -= 3;
    }
    SSEState st = {cls, PyList_New(0), NULL, NULL, NULL, 0};
    if (st.events == NULL) return NULL;
    /* SSEParser.feed: lines up to the last terminator (a trailing CR may start a CRLF) */
    Py_ssize_t cut = (n > 0 && buf[n - 1] == '\r') ? n - 1 : n;
    Py_ssize_t done = 0;
    for (Py_ssize_t i = cut - 1; i >= 0; i--) {
        if (buf[i] == '\n' || buf[i] == '\r') {
            done = i + 1;
            break;
        }
    }
    Py_ssize_t pos = 0;
    while (pos < done) {
        Py_ssize_t e = pos;
        while (buf[e] != '\n' && buf[e] != '\r') e++; /* buf[done - 1] is a terminator */
        if (sse_line(&st, buf + pos, e - pos) < 0) goto fail;
        pos = (buf[e] == '\r' && e + 1 < done && buf[e + 1] == '\n') ? e + 2 : e + 1;
    }
    /* SSEParser.close */
    int clean = 1;
    Py_ssize_t rest = n - done;
    if (rest == 1 && buf[done] == '\r') {
        if (sse_line(&st, "", 0) < 0) goto fail; /* a lone trailing CR ends a line */
    } else if (rest > 0) {
        clean = 0; /* a partial line: the stream was cut */
    }
    if (st.pending) clean = 0;
    sse_reset(&st);
    PyObject *result = Py_BuildValue("(NO)", st.events, clean ? Py_True : Py_False);
    return result;
fail:
    sse_reset(&st);
    Py_DECREF(st.events);
    return NULL;
}

/* configure(JsonError, DupDict, JsonFloat, TextUnit, json_invalid, too_deep, string, key, number) */
static PyObject *
native_configure(PyObject *self, PyObject *args)
{
    PyObject *err, *dd, *jf, *tu, *inv, *deep, *ks, *kk, *kn;
    if (!PyArg_ParseTuple(args, "OO!OO!UUUUU", &err, &PyType_Type, &dd, &jf, &PyType_Type, &tu, &inv, &deep, &ks,
                          &kk, &kn))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)dd, &PyDict_Type) || !PyType_IsSubtype((PyTypeObject *)tu, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "DupDict must subclass dict and TextUnit tuple");
        return NULL;
    }
    Py_XSETREF(JsonError, Py_NewRef(err));
    Py_XSETREF(DupDictType, (PyTypeObject *)Py_NewRef(dd));
    Py_XSETREF(JsonFloatType, Py_NewRef(jf));
    Py_XSETREF(TextUnitType, (PyTypeObject *)Py_NewRef(tu));
    Py_XSETREF(R_INVALID, Py_NewRef(inv));
    Py_XSETREF(R_TOO_DEEP, Py_NewRef(deep));
    Py_XSETREF(K_STRING, Py_NewRef(ks));
    Py_XSETREF(K_KEY, Py_NewRef(kk));
    Py_XSETREF(K_NUMBER, Py_NewRef(kn));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", native_configure, METH_VARARGS, "Hand over jsonraw's types, reason codes and unit kinds."},
    {"decode_units", native_decode_units, METH_VARARGS, "jsonraw.decode_units for wire bytes."},
    {"loads", native_loads, METH_VARARGS, "jsonraw.loads for wire bytes."},
    {"decode_shape", native_decode_shape, METH_VARARGS, "jsonraw.decode_shape (NotImplemented: use the reference)."},
    {"decode_texts", native_decode_texts, METH_VARARGS, "jsonraw.decode_texts (NotImplemented: use the reference)."},
    {"sse_parse_all", native_sse_parse_all, METH_VARARGS, "sse.parse_all for a whole buffered stream."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonraw_native", "Native path of gateway.carriers.jsonraw (see jsonraw.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__jsonraw_native(void)
{
    S_SHADOWED = PyUnicode_InternFromString("shadowed");
    if (S_SHADOWED == NULL) return NULL;
    return PyModule_Create(&module);
}
