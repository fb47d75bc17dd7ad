/* wg_bm25: FTS5's bm25() ranking with each distinct term's IDF computed once per statement.
 *
 * The store's lexical floor (`common.at_least`) names each query term in several phrases of
 * its MATCH expression (24 phrases for five terms and a floor of three). FTS5's own bm25()
 * computes every phrase's IDF on a statement's first row by walking that phrase's whole
 * posting list, so a term named four times has its list walked four times. wg_bm25(tbl, map)
 * takes, as its one argument, one byte per phrase naming the distinct term it holds ('A' + the
 * term's index); phrases with the same byte share one walk. Everything else is bm25() as SQLite
 * documents it (k1 = 1.2, b = 0.75, no column weights): the same figures, in the same order of
 * operations, so the score is bm25()'s to the bit (tests/context/test_fts_native.py compares them
 * row by row). A map that does not fit the expression (wrong length, a byte out of range) falls back to
 * one walk per phrase: never a different score.
 *
 * Python's sqlite3 offers no way to register an FTS5 auxiliary function, and this interpreter's
 * is built without extension loading. install(conn, version, probe) reaches the connection's
 * `sqlite3 *` as the first field after PyObject_HEAD of CPython's `pysqlite_Connection` (the
 * caller admits 3.11 to 3.14), and calls SQLite through the shared library the interpreter's `_sqlite3`
 * already loaded (dlopen with RTLD_NOLOAD: never a second copy). It refuses (returns False)
 * unless that library is loaded, reports the version the interpreter's module reports, and reads
 * back from the handle a limit the caller has just set through the Python API (the caller
 * restores it). The declarations below are SQLite's documented public interface (sqlite3.h, the
 * FTS5 "Extending FTS5" section), written out because CI machines need not have its headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef long long sq_int64;
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_context sqlite3_context;
typedef struct sqlite3_value sqlite3_value;
typedef struct Fts5Context Fts5Context;
typedef struct Fts5ExtensionApi Fts5ExtensionApi;
typedef void (*fts5_extension_function)(const Fts5ExtensionApi *, Fts5Context *, sqlite3_context *, int,
                                        sqlite3_value **);

struct Fts5ExtensionApi {
    int iVersion;
    void *(*xUserData)(Fts5Context *);
    int (*xColumnCount)(Fts5Context *);
    int (*xRowCount)(Fts5Context *, sq_int64 *);
    int (*xColumnTotalSize)(Fts5Context *, int, sq_int64 *);
    int (*xTokenize)(Fts5Context *, const char *, int, void *, int (*)(void *, int, const char *, int, int, int));
    int (*xPhraseCount)(Fts5Context *);
    int (*xPhraseSize)(Fts5Context *, int);
    int (*xInstCount)(Fts5Context *, int *);
    int (*xInst)(Fts5Context *, int, int *, int *, int *);
    sq_int64 (*xRowid)(Fts5Context *);
    int (*xColumnText)(Fts5Context *, int, const char **, int *);
    int (*xColumnSize)(Fts5Context *, int, int *);
    int (*xQueryPhrase)(Fts5Context *, int, void *, int (*)(const Fts5ExtensionApi *, Fts5Context *, void *));
    int (*xSetAuxdata)(Fts5Context *, void *, void (*)(void *));
    void *(*xGetAuxdata)(Fts5Context *, int);
    /* later members are not used */
};

typedef struct fts5_api {
    int iVersion;
    void *xCreateTokenizer;
    void *xFindTokenizer;
    int (*xCreateFunction)(struct fts5_api *, const char *, void *, fts5_extension_function, void (*)(void *));
} fts5_api;

#define SQ_OK 0
#define SQ_NOMEM 7
#define SQ_ROW 100
#define SQ_LIMIT_LIKE_PATTERN_LENGTH 8

/* The SQLite functions used, resolved once from the loaded library. */
static struct {
    int ready;
    const char *(*libversion)(void);
    int (*limit)(sqlite3 *, int, int);
    int (*prepare_v2)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    int (*bind_pointer)(sqlite3_stmt *, int, void *, const char *, void (*)(void *));
    int (*step)(sqlite3_stmt *);
    int (*finalize)(sqlite3_stmt *);
    void (*result_double)(sqlite3_context *, double);
    void (*result_error_code)(sqlite3_context *, int);
    const unsigned char *(*value_text)(sqlite3_value *);
    int (*value_bytes)(sqlite3_value *);
} sq;

static int resolve(void) {
    if (sq.ready) return 1;
    void *lib = dlopen("libsqlite3.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) return 0;
#define FIND(field, name)                                  \
    *(void **)(&sq.field) = dlsym(lib, name);              \
    if (sq.field == NULL) return 0;
    FIND(libversion, "sqlite3_libversion")
    FIND(limit, "sqlite3_limit")
    FIND(prepare_v2, "sqlite3_prepare_v2")
    FIND(bind_pointer, "sqlite3_bind_pointer")
    FIND(step, "sqlite3_step")
    FIND(finalize, "sqlite3_finalize")
    FIND(result_double, "sqlite3_result_double")
    FIND(result_error_code, "sqlite3_result_error_code")
    FIND(value_text, "sqlite3_value_text")
    FIND(value_bytes, "sqlite3_value_bytes")
#undef FIND
    sq.ready = 1; /* the library stays loaded: _sqlite3 holds it, and so does our handle */
    return 1;
}

/* What one statement's ranking keeps between rows. */
typedef struct {
    int nPhrase;
    double avgdl;
    double *idf;  /* per phrase */
    double *freq; /* per phrase, reset each row */
} Ranking;

static void ranking_free(void *p) {
    Ranking *r = (Ranking *)p;
    if (r != NULL) {
        free(r->idf);
        free(r);
    }
}

static int count_row(const Fts5ExtensionApi *api, Fts5Context *fts, void *user) {
    (void)api;
    (void)fts;
    (*(sq_int64 *)user)++;
    return SQ_OK;
}

/* The map argument, when it fits the expression (one letter 'A'..'A'+63 per phrase); else *out = NULL:
 * every phrase walks its own posting list. */
static int map_fits(sqlite3_value **args, int nArgs, int nPhrase, const unsigned char **out) {
    *out = NULL;
    if (nArgs < 1) return 0;
    const unsigned char *map = sq.value_text(args[0]);
    if (map == NULL || sq.value_bytes(args[0]) != nPhrase) return 0;
    for (int i = 0; i < nPhrase; i++) {
        if (map[i] < 'A' || map[i] > 'A' + 63) return 0;
    }
    *out = map;
    return 1;
}

static int ranking_make(const Fts5ExtensionApi *api, Fts5Context *fts, int nArgs, sqlite3_value **args,
                        Ranking **out) {
    sq_int64 nRow = 0, nToken = 0;
    int nPhrase = api->xPhraseCount(fts);
    Ranking *r = calloc(1, sizeof(Ranking));
    if (r == NULL) return SQ_NOMEM;
    r->nPhrase = nPhrase;
    r->idf = calloc((size_t)(nPhrase > 0 ? nPhrase : 1) * 2, sizeof(double));
    if (r->idf == NULL) {
        free(r);
        return SQ_NOMEM;
    }
    r->freq = r->idf + nPhrase;
    int rc = api->xRowCount(fts, &nRow);
    if (rc == SQ_OK) rc = api->xColumnTotalSize(fts, -1, &nToken);
    if (rc == SQ_OK) r->avgdl = (double)nToken / (double)nRow;
    const unsigned char *map;
    map_fits(args, nArgs, nPhrase, &map);
    double known[64];
    int have[64] = {0};
    for (int i = 0; rc == SQ_OK && i < nPhrase; i++) {
        int term = map != NULL ? map[i] - 'A' : -1;
        if (term >= 0 && have[term]) {
            r->idf[i] = known[term];
            continue;
        }
        sq_int64 nHit = 0;
        rc = api->xQueryPhrase(fts, i, (void *)&nHit, count_row);
        if (rc != SQ_OK) break;
        double idf = log((nRow - nHit + 0.5) / (nHit + 0.5));
        if (idf <= 0.0) idf = 1e-6;
        r->idf[i] = idf;
        if (term >= 0) {
            known[term] = idf;
            have[term] = 1;
        }
    }
    if (rc != SQ_OK) {
        ranking_free(r);
        return rc;
    }
    rc = api->xSetAuxdata(fts, r, ranking_free); /* on failure SQLite has already called ranking_free */
    if (rc != SQ_OK) return rc;
    *out = r;
    return SQ_OK;
}

static void wg_bm25(const Fts5ExtensionApi *api, Fts5Context *fts, sqlite3_context *ctx, int nArgs,
                    sqlite3_value **args) {
    const double k1 = 1.2;
    const double b = 0.75;
    Ranking *r = (Ranking *)api->xGetAuxdata(fts, 0);
    int rc = SQ_OK;
    if (r == NULL) rc = ranking_make(api, fts, nArgs, args, &r);
    int nInst = 0;
    if (rc == SQ_OK) {
        memset(r->freq, 0, sizeof(double) * (size_t)r->nPhrase);
        rc = api->xInstCount(fts, &nInst);
    }
    for (int i = 0; rc == SQ_OK && i < nInst; i++) {
        int ip, ic, io;
        rc = api->xInst(fts, i, &ip, &ic, &io);
        if (rc == SQ_OK) r->freq[ip] += 1.0;
    }
    double D = 0.0;
    if (rc == SQ_OK) {
        int nTok;
        rc = api->xColumnSize(fts, -1, &nTok);
        D = (double)nTok;
    }
    if (rc != SQ_OK) {
        sq.result_error_code(ctx, rc);
        return;
    }
    double score = 0.0;
    for (int i = 0; i < r->nPhrase; i++) {
        score += r->idf[i] * ((r->freq[i] * (k1 + 1.0)) / (r->freq[i] + k1 * (1 - b + b * D / r->avgdl)));
    }
    sq.result_double(ctx, -1.0 * score);
}

static PyObject *install(PyObject *self, PyObject *args) {
    PyObject *conn;
    const char *version;
    int probe;
    if (!PyArg_ParseTuple(args, "Osi", &conn, &version, &probe)) return NULL;
    if (strcmp(Py_TYPE(conn)->tp_name, "sqlite3.Connection") != 0) Py_RETURN_FALSE; /* exactly, no subclass */
    if (!resolve() || strcmp(sq.libversion(), version) != 0) Py_RETURN_FALSE;
    sqlite3 *db = *(sqlite3 **)((char *)conn + sizeof(PyObject));
    if (db == NULL || sq.limit(db, SQ_LIMIT_LIKE_PATTERN_LENGTH, -1) != probe) Py_RETURN_FALSE;
    fts5_api *api = NULL;
    sqlite3_stmt *stmt = NULL;
    int ok = 0;
    Py_BEGIN_ALLOW_THREADS
    if (sq.prepare_v2(db, "SELECT fts5(?1)", -1, &stmt, NULL) == SQ_OK) {
        if (sq.bind_pointer(stmt, 1, (void *)&api, "fts5_api_ptr", NULL) == SQ_OK && sq.step(stmt) == SQ_ROW &&
            api != NULL && api->iVersion >= 2) {
            ok = api->xCreateFunction(api, "wg_bm25", NULL, wg_bm25, NULL) == SQ_OK;
        }
        sq.finalize(stmt);
    }
    Py_END_ALLOW_THREADS
    if (ok) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(conn, sqlite_version, probe) -> bool: register wg_bm25 on a sqlite3.Connection"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fts_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fts_native(void) { return PyModule_Create(&module); }
