"""Shared by the native modules' differential tests: where a module is not built, its
comparisons skip, except in CI (WIREGATE_REQUIRE_NATIVE=1), where a missing module fails."""

from __future__ import annotations

import os

import pytest

REQUIRED = os.environ.get("WIREGATE_REQUIRE_NATIVE") == "1"


def needs(available: bool, what: str) -> pytest.MarkDecorator:
    """Skip a comparison when `what` is not built here (never in CI: there it then fails)."""
    return pytest.mark.skipif(not available and not REQUIRED, reason=f"{what} not built on this machine")


def assert_built(available: bool, module: str, what: str) -> None:
    """The module is built where CI requires it; elsewhere a missing one is a skip, said so."""
    if REQUIRED:
        assert available, f"{module} was not built (see setup.py)"
    elif not available:
        pytest.skip(f"{what} not built on this machine (set WIREGATE_REQUIRE_NATIVE=1 to fail instead)")
