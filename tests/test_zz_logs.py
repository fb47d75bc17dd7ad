"""Runs last: after every other test has driven the gateway (blocked secrets included),
no log line holds a secret, a credential, a gateway key or a body, and every field is on
the allow-list."""

from __future__ import annotations

import json
from typing import Any

from gateway.obs.logging import ALLOWED_FIELDS
from tests import test_checkapi, test_e2e_secrets, test_evasion, test_heartbeats
from tests.harness import ISSUED_KEYS


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}


def test_no_sensitive_value_in_any_log_line(captured_logs: Any) -> None:
    text = captured_logs.text()
    assert text.count("\n") > 50  # the suite really did log
    sensitive = {test_e2e_secrets.SECRET, test_e2e_secrets.SECRET_2, test_checkapi.SECRET, test_heartbeats.SECRET,
                 test_evasion.NUMBER_LITERAL, *test_evasion.SECRETS, *ISSUED_KEYS}
    for value in sensitive:
        for form in _forms(value):
            assert form not in text
        for line in value.splitlines():  # parts of multi-line secrets (private keys) too
            if len(line) >= 16:
                assert line not in text
    for marker in ("mock-scenario:", "Mock reply", "Bearer ", "x-api-key", '"messages"'):
        assert marker not in text


def test_every_log_field_is_allow_listed(captured_logs: Any) -> None:
    for record in captured_logs.records():
        extra = set(record) - ALLOWED_FIELDS - {"ts", "level", "event"}
        assert not extra, extra
