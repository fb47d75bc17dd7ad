"""A systemd unit file read the way systemd reads it: sections, `Key=value` settings in
order (a key may repeat; an empty assignment resets the list), comments and line
continuations."""

from __future__ import annotations

from pathlib import Path


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    logical: list[str] = []
    lines: list[str] = []
    for raw in text.splitlines():
        if raw.endswith("\\"):
            logical.append(raw[:-1])
            continue
        logical.append(raw)
        lines.append(" ".join(part.strip() for part in logical))
        logical = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = sections.setdefault(stripped[1:-1], {})
            continue
        if current is None or "=" not in stripped:
            raise ValueError(f"not a unit file line: {line!r}")
        key, value = (part.strip() for part in stripped.split("=", 1))
        values = current.setdefault(key, [])
        if value == "":
            values.clear()  # systemd: an empty assignment resets a list setting
            values.append("")
        else:
            if values == [""]:
                values.clear()
            values.append(value)
    return sections


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    return parse_unit(path.read_text(encoding="utf-8"))


def last(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str | None:
    values = unit.get(section, {}).get(key)
    return values[-1] if values else None
