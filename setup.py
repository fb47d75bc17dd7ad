"""The native modules: the strict JSON reader's fast path (gateway/carriers/jsonraw.py, with
the attribution identity's message builder beside it), the encoded-run finder's
(gateway/inspection/decoders.py), the SQLite store's exact vector scoring
(gateway/context/store/common.py) and its BM25 ranking with one IDF per distinct term
(gateway/context/store/sqlite.py).

Everything else is in pyproject.toml. `optional=True`: where no C compiler or Python headers
are present the install still succeeds and jsonraw, decoders and the store use their
pure-Python references, and the store FTS5's own bm25() (CI sets WIREGATE_REQUIRE_NATIVE=1 so a
missing module fails a test there).
"""

import sys

from setuptools import Extension, setup

GCC_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

# (module, its one C source), all built the same way
NATIVE = [
    ("gateway.carriers._jsonraw_native", "gateway/carriers/_jsonraw_native.c"),
    ("gateway.inspection._decode_native", "gateway/inspection/_decode_native.c"),
    ("gateway.context.store._vector_native", "gateway/context/store/_vector_native.c"),
    ("gateway.context.store._fts_native", "gateway/context/store/_fts_native.c"),
]

setup(
    ext_modules=[
        Extension(
            name,
            sources=[source],
            extra_compile_args=[] if sys.platform == "win32" else GCC_FLAGS,
            optional=True,
        )
        for name, source in NATIVE
    ]
)
