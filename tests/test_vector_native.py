"""The SQLite store's native vector scoring (gateway/context/store/_vector_native.c) against
the pure-Python reference in store/common.py: the same (cosine, id) pairs, bit for bit and in
the same order, on generated vectors of every small dimension (subnormals, signed zeros,
infinities and NaNs included), on rows with a missing vector or one of another dimension,
and at every threshold; the native module refuses malformed input with a clear error (rows
from the store never are: the reference need not); and a real store searches the same with
either path."""

from __future__ import annotations

import math
import random
import struct
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.context import search
from gateway.context.store import common
from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase
from tests import native_build

needs_native = native_build.needs(common.VECTOR_NATIVE_AVAILABLE, "native vector scoring")


def test_native_module_is_built_when_required() -> None:
    native_build.assert_built(
        common.VECTOR_NATIVE_AVAILABLE, "gateway.context.store._vector_native", "native vector scoring"
    )


@pytest.fixture(autouse=True)
def _restore_native() -> Iterator[None]:
    yield
    common.use_native_vectors(True)


def _bits(pairs: list[tuple[float, str]]) -> list[tuple[bytes, str]]:
    """Floats by their bits: -0.0 and 0.0 differ, as would two NaNs of other payloads."""
    return [(struct.pack("<d", cos), ident) for cos, ident in pairs]


def _both(query: bytes, rows: list[tuple[str, bytes | None]], floor: float) -> list[tuple[float, str]]:
    from gateway.context.store import _vector_native

    ref = common.admitted_reference(query, rows, floor)
    nat = _vector_native.admitted(query, rows, floor)
    assert _bits(nat) == _bits(ref)
    return ref


floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
floats64 = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)


@needs_native
@settings(max_examples=400, deadline=None)
@given(
    dim=st.integers(0, 24),
    data=st.data(),
    floor=st.one_of(st.floats(-1.5, 1.5), st.sampled_from([0.3, 0.0, -0.0, math.inf, -math.inf, math.nan])),
)
def test_generated_rows_score_the_same(dim: int, data: st.DataObject, floor: float) -> None:
    query = array("d", data.draw(st.lists(floats64, min_size=dim, max_size=dim))).tobytes()
    rows: list[tuple[str, bytes | None]] = []
    for i in range(data.draw(st.integers(0, 12))):
        shape = data.draw(st.sampled_from(["same", "same", "same", "none", "shorter", "longer", "ragged"]))
        if shape == "none":
            blob = None
        elif shape == "ragged":  # not a whole number of float32s
            blob = data.draw(st.binary(min_size=1, max_size=4 * dim + 3).filter(lambda b: len(b) % 4 != 0))
        else:
            n = {"same": dim, "shorter": max(0, dim - 1 - data.draw(st.integers(0, 3))), "longer": dim + 1}[shape]
            if shape == "shorter" and n == dim:
                n = dim + 2
            blob = array("f", data.draw(st.lists(floats32, min_size=n, max_size=n))).tobytes()
        rows.append((f"m{i}", blob))
    _both(query, rows, floor)


@needs_native
def test_unit_vectors_rank_and_admit_the_same() -> None:
    """Realistic input: unit vectors as the store writes them, thousands of rows, the
    service's admission threshold; the scores agree with a plain dot product to rounding."""
    rng = random.Random(2086)
    for dim in (1, 3, 48, 384, 1536):

        def unit(near: list[float] | None = None, spread: float = 1.0, dim: int = dim) -> list[float]:
            v = [(near[i] if near else 0.0) + rng.gauss(0.0, spread / math.sqrt(dim)) for i in range(dim)]
            norm = math.sqrt(sum(x * x for x in v))
            return [x / norm for x in v]

        q = unit()
        # Half unrelated (cosines near 0 in many dimensions), half near the query at spreads
        # that put their cosines on both sides of the threshold.
        rows: list[tuple[str, bytes | None]] = [
            (f"m{i}", common.pack_vector(unit(q, rng.uniform(0.2, 4.0)) if i % 2 else unit()))
            for i in range(3000 if dim < 1000 else 300)
        ]
        got = _both(array("d", q).tobytes(), rows, search.MIN_COSINE)
        assert got and all(cos >= search.MIN_COSINE for cos, _ in got)
        if dim > 1:
            assert len(got) < len(rows)  # the threshold cut some: both sides of it were compared
        for cos, ident in got[:20]:
            blob = dict(rows)[ident]
            assert blob is not None
            assert math.isclose(cos, math.fsum(x * y for x, y in zip(array("f", blob), q, strict=True)), abs_tol=1e-9)


@needs_native
def test_native_refuses_malformed_input() -> None:
    from gateway.context.store import _vector_native

    one = array("d", [1.0]).tobytes()
    with pytest.raises(ValueError):
        _vector_native.admitted(b"\x00" * 7, [], 0.0)
    with pytest.raises(TypeError):
        _vector_native.admitted(one, [("m", "not bytes")], 0.0)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _vector_native.admitted(one, [("m", b"\x00" * 4, "extra")], 0.0)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _vector_native.admitted(one, (("m", None),), 0.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _vector_native.admitted(one, [], "0.3")  # type: ignore[arg-type]


@needs_native
@pytest.mark.asyncio
async def test_a_store_searches_the_same_with_either_path(tmp_path: Path) -> None:
    store = SqliteContextStore(SqliteDatabase(str(tmp_path / "v.db")))
    await store.open()
    try:
        from gateway.context.service import ContextService

        words = ["billing", "deploy", "friday", "postgres", "cache", "retry", "schema", "index"]

        async def embed(texts: list[str]) -> list[list[float]]:
            return [[float(t.count(w)) for w in words] + [0.05] for t in texts]

        svc = ContextService(store, check_write=lambda texts: (), embed=embed)
        await svc.start()
        sid = (await svc.create_scope(title="v", summary="v", idempotency_key="v", principal=None))[0].scope_id
        rng = random.Random(7)
        for _ in range(60):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 8)))
            await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": text})
        results = {}
        for native in (True, False):
            common.use_native_vectors(native)
            found = []
            for query in ("billing deploy", "friday friday postgres", "cache retry schema index"):
                res = await svc.search(sid, "atomic-memory", query, mode="vector", limit=10)
                found.append([(h.head.artifact_id, h.score, dict(h.channel_scores)) for h in res.hits])
            results[native] = found
        assert results[True] == results[False]
        assert all(results[True])  # every query found something: the comparison is not of empty lists
    finally:
        await store.close()
