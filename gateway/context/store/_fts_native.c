/* wg_bm25: FTS5's bm25() ranking with each distinct term's IDF computed once per statement, each
 * term counted once per row, and the rows that cannot reach the caller's cut left unmeasured.
 *
 * The store's lexical floor (`common.at_least`) names each query term in several phrases of
 * its MATCH expression (19 phrases for five terms and a floor of three). FTS5's own bm25()
 * computes every phrase's IDF on a statement's first row by walking that phrase's whole
 * posting list, and scores every phrase that reports the row. wg_bm25(tbl, map [, want [, known]])
 * takes one byte per phrase naming the distinct term it holds ('A' + the term's index): phrases
 * with the same byte share one walk, and a row's count of a term is the first non-zero count its
 * phrases report (a phrase reports either all of the row's instances or, in a branch that did
 * not match, none; the rest of its phrases are not read), so a term counts once however many
 * matching branches name it. The terms are summed in the order the map first names them.
 * Everything else is bm25() as SQLite documents it (k1 = 1.2, b = 0.75, no column weights), in
 * the same order of operations: over the exclusive form of the floor, or the plain OR, the score
 * is bm25()'s to the bit, and over the form without NOT (cheaper to match, the same rows) it is
 * the exclusive form's bm25() (tests/context/test_fts_native.py compares them row by row). A map that does not fit the
 * expression (wrong length, a byte out of range) falls back to bm25() itself: one walk and one
 * part per phrase.
 *
 * known (with a map that fits): "n0,n1,...", how many rows hold each term ('A' + i), for a caller
 * that holds them for the statement's snapshot (the store asks wg_df once per snapshot and keeps
 * them): those terms' posting lists are not walked. One that does not fit (see known_counts) is
 * ignored: every term is walked.
 *
 * want > 0 (with a map that fits): the caller keeps only the rows scoring no worse than the
 * want-th best (ties included). A row holds at least as many tokens as the query instances it
 * holds, and each term's part falls as the row grows, so its parts at that length bound its
 * score; when the bound is below the want-th best score so far, the row cannot be kept, its
 * length (a lookup in FTS5's docsize table, the largest per-row cost) is never read, and it
 * scores PRUNED (0.0, worse than every scored row: those hold a term, so score below zero).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef long long sq_int64;
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_context sqlite3_context;
typedef struct sqlite3_value sqlite3_value;
typedef struct Fts5Context Fts5Context;
typedef struct Fts5ExtensionApi Fts5ExtensionApi;
typedef struct Fts5PhraseIter {
    const unsigned char *a;
    const unsigned char *b;
} Fts5PhraseIter;
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
    int (*xPhraseFirst)(Fts5Context *, int, Fts5PhraseIter *, int *, int *);
    void (*xPhraseNext)(Fts5Context *, Fts5PhraseIter *, int *, int *);
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
#define SQ_TRANSIENT ((void (*)(void *)) - 1)
#define SQ_LIMIT_LIKE_PATTERN_LENGTH 8
#define MAX_WANT 100000 /* more rows wanted than this: no pruning */
#define PRUNED 0.0         /* a pruned row's score: worse than any scored row's (those are negative) */

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
    void (*result_text)(sqlite3_context *, const char *, int, void (*)(void *));
    const unsigned char *(*value_text)(sqlite3_value *);
    sq_int64 (*value_int64)(sqlite3_value *);
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
    FIND(result_text, "sqlite3_result_text")
    FIND(value_text, "sqlite3_value_text")
    FIND(value_int64, "sqlite3_value_int64")
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
    /* With a map that fits: the distinct terms in the order the map first names them (slots). */
    int nTerm;    /* 0 without a map that fits */
    int *slot;    /* per phrase: its term's slot */
    double tidf[64];
    double tf[64]; /* per slot, each row: the term's count in the row */
    /* Pruning (want > 0): the magnitudes of the `want` best scores so far, a min-heap. */
    int want;
    int nHeap;
    double *heap;
} Ranking;

static void ranking_free(void *p) {
    Ranking *r = (Ranking *)p;
    if (r != NULL) {
        free(r->idf);
        free(r->slot);
        free(r->heap);
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
 * every phrase walks its own posting list and is scored on its own. */
static int map_fits(sqlite3_value **args, int nArgs, int nPhrase, const unsigned char **out) {
    *out = NULL;
    if (nArgs < 1 || nPhrase < 1) return 0;
    const unsigned char *map = sq.value_text(args[0]);
    if (map == NULL || sq.value_bytes(args[0]) != nPhrase) return 0;
    for (int i = 0; i < nPhrase; i++) {
        if (map[i] < 'A' || map[i] > 'A' + 63) return 0;
    }
    *out = map;
    return 1;
}

/* The known-counts argument (wg_bm25's third), when it fits: "n0,n1,...", the number of rows holding
 * each term, one decimal per term letter ('A' + i) up to the last the map names, none above the
 * table's row count. Returns how many it read into known[] (0 when it does not fit: every term's
 * posting list is walked, as without it). */
static int known_counts(sqlite3_value **args, int nArgs, const unsigned char *map, int nPhrase, sq_int64 nRow,
                        sq_int64 known[64]) {
    if (map == NULL || nArgs < 3) return 0;
    const unsigned char *text = sq.value_text(args[2]);
    if (text == NULL) return 0;
    int need = 0;
    for (int i = 0; i < nPhrase; i++) {
        if (map[i] - 'A' + 1 > need) need = map[i] - 'A' + 1;
    }
    int n = 0;
    const unsigned char *c = text;
    while (n < 64) {
        if (*c < '0' || *c > '9') return 0;
        sq_int64 v = 0;
        for (int digits = 0; *c >= '0' && *c <= '9'; c++, digits++) {
            if (digits >= 18) return 0;
            v = v * 10 + (*c - '0');
        }
        if (v > nRow) return 0;
        known[n++] = v;
        if (*c == '\0') break;
        if (*c++ != ',') return 0;
    }
    return n == need && *c == '\0' ? n : 0;
}

static int ranking_make(const Fts5ExtensionApi *api, Fts5Context *fts, int nArgs, sqlite3_value **args,
                        Ranking **out) {
    sq_int64 nRow = 0, nToken = 0;
    int nPhrase = api->xPhraseCount(fts);
    Ranking *r = calloc(1, sizeof(Ranking));
    if (r == NULL) return SQ_NOMEM;
    r->nPhrase = nPhrase;
    r->idf = calloc((size_t)(nPhrase > 0 ? nPhrase : 1) * 2, sizeof(double));
    int rc = r->idf == NULL ? SQ_NOMEM : SQ_OK;
    const unsigned char *map = NULL;
    if (rc == SQ_OK) {
        r->freq = r->idf + nPhrase;
        rc = api->xRowCount(fts, &nRow);
    }
    if (rc == SQ_OK) rc = api->xColumnTotalSize(fts, -1, &nToken);
    if (rc == SQ_OK) {
        r->avgdl = (double)nToken / (double)nRow;
        if (map_fits(args, nArgs, nPhrase, &map)) {
            r->slot = calloc((size_t)nPhrase, sizeof(int));
            if (r->slot == NULL) rc = SQ_NOMEM;
        }
    }
    int first[64]; /* each term letter's slot, -1 until the map names it */
    for (int t = 0; t < 64; t++) first[t] = -1;
    sq_int64 known[64];
    int nKnown = rc == SQ_OK ? known_counts(args, nArgs, map, nPhrase, nRow, known) : 0;
    for (int i = 0; rc == SQ_OK && i < nPhrase; i++) {
        int term = map != NULL ? map[i] - 'A' : -1;
        if (term >= 0 && first[term] >= 0) {
            r->slot[i] = first[term];
            r->idf[i] = r->tidf[first[term]];
            continue;
        }
        sq_int64 nHit = 0;
        if (term >= 0 && term < nKnown) {
            nHit = known[term]; /* the caller's count for this snapshot: the walk below would find it */
        } else {
            rc = api->xQueryPhrase(fts, i, (void *)&nHit, count_row);
            if (rc != SQ_OK) break;
        }
        double idf = log((nRow - nHit + 0.5) / (nHit + 0.5));
        if (idf <= 0.0) idf = 1e-6;
        r->idf[i] = idf;
        if (term >= 0) {
            first[term] = r->slot[i] = r->nTerm;
            r->tidf[r->nTerm++] = idf;
        }
    }
    if (rc == SQ_OK && map != NULL && nArgs >= 2) {
        sq_int64 want = sq.value_int64(args[1]);
        if (want > 0 && want <= MAX_WANT) {
            r->heap = calloc((size_t)want, sizeof(double));
            if (r->heap == NULL) rc = SQ_NOMEM;
            r->want = (int)want;
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

/* One term's (or phrase's) part of the score: bm25()'s expression, in its order of operations. */
static inline double part(double idf, double f, double D, double avgdl) {
    const double k1 = 1.2;
    const double b = 0.75;
    return idf * ((f * (k1 + 1.0)) / (f + k1 * (1 - b + b * D / avgdl)));
}

/* Keep `mag` among the `want` best magnitudes (a min-heap: heap[0] is the want-th best once full). */
static void heap_offer(Ranking *r, double mag) {
    double *h = r->heap;
    int i;
    if (r->nHeap < r->want) {
        i = r->nHeap++;
        while (i > 0 && h[(i - 1) / 2] > mag) {
            h[i] = h[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        h[i] = mag;
        return;
    }
    if (mag <= h[0]) return;
    i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= r->nHeap) break;
        if (c + 1 < r->nHeap && h[c + 1] < h[c]) c++;
        if (h[c] >= mag) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = mag;
}

static void wg_bm25(const Fts5ExtensionApi *api, Fts5Context *fts, sqlite3_context *ctx, int nArgs,
                    sqlite3_value **args) {
    Ranking *r = (Ranking *)api->xGetAuxdata(fts, 0);
    int rc = SQ_OK;
    if (r == NULL) rc = ranking_make(api, fts, nArgs, args, &r);
    if (rc != SQ_OK) {
        sq.result_error_code(ctx, rc);
        return;
    }
    /* The row's count of each phrase, read from that phrase's own position list (the lists
     * xInstCount/xInst would merge into one sorted array, which nothing here needs). With a map,
     * one count per term: a phrase reports either all of the row's instances of its term or, in a
     * branch that did not match, none, so a term's count is the first non-zero one its phrases
     * report, and its other phrases are not read. */
    double *count = r->nTerm > 0 ? r->tf : r->freq;
    memset(count, 0, sizeof(double) * (size_t)(r->nTerm > 0 ? r->nTerm : r->nPhrase));
    for (int i = 0; rc == SQ_OK && i < r->nPhrase; i++) {
        double *n = r->nTerm > 0 ? &count[r->slot[i]] : &count[i];
        if (*n > 0.0) continue; /* this term is counted (without a map each phrase is read once) */
        Fts5PhraseIter it;
        int ic = -1, io = 0;
        rc = api->xPhraseFirst(fts, i, &it, &ic, &io);
        for (; rc == SQ_OK && ic >= 0; api->xPhraseNext(fts, &it, &ic, &io)) *n += 1.0;
    }
    if (rc != SQ_OK) {
        sq.result_error_code(ctx, rc);
        return;
    }
    if (r->nTerm > 0) {
        double held = 0.0;
        for (int t = 0; t < r->nTerm; t++) held += r->tf[t];
        if (r->want > 0 && r->nHeap == r->want) {
            /* The row holds `held` tokens of the query at least, and each part falls as the row
             * grows: its parts at that length bound its score (the same operations, each monotone,
             * so the bound holds in floating point too). A bound below the want-th best score so far
             * is below the statement's final one: the row cannot be among the best, and its length
             * is never read. */
            double bound = 0.0;
            for (int t = 0; t < r->nTerm; t++) bound += part(r->tidf[t], r->tf[t], held, r->avgdl);
            if (bound < r->heap[0]) {
                sq.result_double(ctx, PRUNED);
                return;
            }
        }
    }
    int nTok;
    rc = api->xColumnSize(fts, -1, &nTok);
    if (rc != SQ_OK) {
        sq.result_error_code(ctx, rc);
        return;
    }
    const double D = (double)nTok;
    double score = 0.0;
    if (r->nTerm > 0) {
        for (int t = 0; t < r->nTerm; t++) score += part(r->tidf[t], r->tf[t], D, r->avgdl);
        if (r->want > 0) heap_offer(r, score);
    } else {
        for (int i = 0; i < r->nPhrase; i++) score += part(r->idf[i], r->freq[i], D, r->avgdl);
    }
    sq.result_double(ctx, -1.0 * score);
}

/* wg_df(tbl): "n0,n1,...", the number of rows holding each phrase of the expression (the walk
 * wg_bm25 makes for a term it is not told the count of), computed once per statement. The store
 * asks it for the terms whose counts it does not hold for the current snapshot, and passes the
 * counts to wg_bm25 afterwards. */
static void df_free(void *p) { free(p); }

static void wg_df(const Fts5ExtensionApi *api, Fts5Context *fts, sqlite3_context *ctx, int nArgs,
                  sqlite3_value **args) {
    (void)nArgs;
    (void)args;
    char *text = (char *)api->xGetAuxdata(fts, 0);
    if (text == NULL) {
        int nPhrase = api->xPhraseCount(fts);
        text = malloc((size_t)(nPhrase > 0 ? nPhrase : 1) * 21 + 1); /* a comma and 20 digits each */
        if (text == NULL) {
            sq.result_error_code(ctx, SQ_NOMEM);
            return;
        }
        text[0] = '\0';
        size_t at = 0;
        int rc = SQ_OK;
        for (int i = 0; rc == SQ_OK && i < nPhrase; i++) {
            sq_int64 nHit = 0;
            rc = api->xQueryPhrase(fts, i, (void *)&nHit, count_row);
            if (rc == SQ_OK) at += (size_t)snprintf(text + at, 22, i ? ",%lld" : "%lld", (long long)nHit);
        }
        if (rc != SQ_OK) free(text);
        if (rc == SQ_OK) rc = api->xSetAuxdata(fts, text, df_free); /* on failure SQLite has freed it */
        if (rc != SQ_OK) {
            sq.result_error_code(ctx, rc);
            return;
        }
    }
    sq.result_text(ctx, text, -1, SQ_TRANSIENT);
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
            ok = api->xCreateFunction(api, "wg_bm25", NULL, wg_bm25, NULL) == SQ_OK &&
                 api->xCreateFunction(api, "wg_df", NULL, wg_df, NULL) == SQ_OK;
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
