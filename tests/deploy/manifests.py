"""Reading rendered Kubernetes manifests and PromQL expressions.

Manifests are parsed with PyYAML when it is installed; otherwise `kubectl` turns them into
JSON offline (`kubectl patch --local` with an empty patch changes nothing and contacts no
cluster), so the Kubernetes checks need no Python YAML library."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any


def kustomize(directory: str) -> str:
    return subprocess.run(
        ["kubectl", "kustomize", directory], check=True, capture_output=True, text=True, timeout=120
    ).stdout


def load_manifests(text: str) -> list[dict[str, Any]]:
    try:
        import yaml
    except ImportError:
        out = subprocess.run(
            ["kubectl", "patch", "--local", "--type=merge", "-p", "{}", "-o", "json", "-f", "-"],
            input=text,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        decoder, objects, i = json.JSONDecoder(), [], 0
        while True:
            while i < len(out) and out[i].isspace():
                i += 1
            if i >= len(out):
                return objects
            obj, i = decoder.raw_decode(out, i)
            objects.append(obj)
    return [doc for doc in yaml.safe_load_all(text) if doc]


# --- PromQL --------------------------------------------------------------------------------

_METRIC = re.compile(r"\b(wiregate_[a-zA-Z0-9_:]+)\b")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"\b(wiregate_[a-zA-Z0-9_:]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


def metric_names(expr: str) -> set[str]:
    """Every series name an expression reads (all of ours carry the wiregate_ prefix)."""
    return set(_METRIC.findall(expr))


def grouping_labels(expr: str) -> set[str]:
    out: set[str] = set()
    for group in _GROUPING.findall(expr):
        out |= {label.strip() for label in group.split(",") if label.strip()}
    return out


def matchers(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) for every label matcher in a selector."""
    out = []
    for metric, body in _SELECTOR.findall(expr):
        pos = 0
        while pos < len(body):
            m = _MATCHER.match(body, pos)
            if m is None:
                raise ValueError(f"cannot read label matchers {body!r} in {expr!r}")
            out.append((metric, m.group(1), m.group(2), m.group(3)))
            pos = m.end()
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) for every query of every panel, rows included."""
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out
