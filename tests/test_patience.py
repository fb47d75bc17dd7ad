"""The caller's declared timeout (`x-stainless-timeout` / `x-stainless-read-timeout`)."""

from __future__ import annotations

from gateway.proxy import patience


def test_the_shortest_readable_declared_timeout_wins() -> None:
    assert patience.declared_timeout({}) is None
    assert patience.declared_timeout({"x-stainless-read-timeout": "600.0"}) == 600.0
    both = {"x-stainless-timeout": "30", "x-stainless-read-timeout": "12.5"}
    assert patience.declared_timeout(both) == 12.5
    for bad in ("", "soon", "nan", "inf", "-1", "0"):
        assert patience.declared_timeout({"x-stainless-timeout": bad}) is None


def test_a_declared_timeout_only_shortens_the_deadline() -> None:
    assert patience.waits_until({}, 100.0, 700.0) == 700.0
    assert patience.waits_until({"x-stainless-timeout": "10"}, 100.0, 700.0) == 110.0
    assert patience.waits_until({"x-stainless-timeout": "1000"}, 100.0, 700.0) == 700.0
