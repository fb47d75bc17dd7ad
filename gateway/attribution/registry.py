"""The block registry: every block id a report may name, and what it means.

Owns: the PromptBlock types, origins, controls and their legal pairs (SPEC §11, the
attribution spec's table), lifetimes, the built-in entries, the rule that turns unknown or
path-like ids into `unattributed.prompt_surface`, and extending the registry from
configuration (validated here, so a bad entry is refused when the configuration loads).
Must not: hold any value from a request. A block id is code- or operator-controlled text;
it never carries an app or user value, a source path or a source identifier.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

BlockType = Literal["instruction", "turn_context", "notice", "reference"]
Origin = Literal["host_policy", "host_generated", "workspace_configuration", "user_task_payload", "unknown"]
Control = Literal["direct", "assembly", "none", "unknown"]
Lifetime = Literal["boundary_only", "session_persistent", "until_replaced", "unknown"]

BLOCK_TYPES: tuple[str, ...] = get_args(BlockType)
ORIGINS: tuple[str, ...] = get_args(Origin)
CONTROLS: tuple[str, ...] = get_args(Control)
LIFETIMES: tuple[str, ...] = get_args(Lifetime)

# The legal origin/control pairs and what each may be used for.
LEGAL: Mapping[str, frozenset[str]] = {
    "host_policy": frozenset({"direct"}),  # content and injection may be changed
    "host_generated": frozenset({"direct", "assembly"}),  # generation, selection, lifetime
    "workspace_configuration": frozenset({"assembly"}),  # lossless assembly changes only
    "user_task_payload": frozenset({"assembly", "none"}),  # in the ledger, never an opportunity
    "unknown": frozenset({"unknown"}),  # diagnosis only
}
# Origins whose material can be an optimisation opportunity (the controllable view).
ELIGIBLE_ORIGINS = frozenset({"host_policy", "host_generated", "workspace_configuration"})
# The mutually exclusive partition of compiled material, by origin.
PARTITION: Mapping[str, str] = {
    "host_policy": "owned",
    "host_generated": "owned",
    "workspace_configuration": "workspaceConfiguration",
    "user_task_payload": "userTaskPayload",
    "unknown": "unknown",
}

UNATTRIBUTED = "unattributed.prompt_surface"
_ID = re.compile(r"^[a-z][a-z0-9_]{0,31}(\.[a-z][a-z0-9_]{0,31}){1,5}$")
# A last segment like these makes an id look like a file name: refused as path-like.
_FILE_SUFFIXES = frozenset(
    {"md", "txt", "py", "js", "ts", "json", "yaml", "yml", "toml", "rs", "go", "java", "c", "h", "sh", "cfg", "ini"}
)


class RegistryError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BlockSpec:
    id: str
    display_name: str
    type: BlockType
    origin: Origin
    control: Control
    lifetime: Lifetime
    action: str  # the one suggested action
    validation: str  # what must be checked before and after taking it
    target: int | None = None  # per-injection target estimate, tokens; None: no target
    singleton: bool = False  # until_replaced: a new instance replaces the one before it
    compactable: bool = False  # a successful compaction ends it
    compacts: bool = False  # its arrival is a compaction: compactable blocks end first

    @property
    def eligible(self) -> bool:
        """Controllable material: may be an opportunity (never user payload or unknown)."""
        return self.origin in ELIGIBLE_ORIGINS and self.id != UNATTRIBUTED


def well_formed_id(block_id: str) -> bool:
    """A registrable id: dotted lower-case segments, nothing path- or file-like."""
    if not _ID.match(block_id):
        return False
    return block_id.rsplit(".", 1)[-1] not in _FILE_SUFFIXES


def check(spec: BlockSpec) -> BlockSpec:
    if not well_formed_id(spec.id) or spec.id == UNATTRIBUTED:
        raise RegistryError(f"block id {spec.id!r} is not a registrable id")
    if spec.type not in BLOCK_TYPES or spec.lifetime not in LIFETIMES:
        raise RegistryError(f"block {spec.id}: unknown type or lifetime")
    if spec.control not in LEGAL.get(spec.origin, frozenset()):
        raise RegistryError(f"block {spec.id}: origin {spec.origin!r} with control {spec.control!r} is not legal")
    if spec.target is not None and spec.target < 0:
        raise RegistryError(f"block {spec.id}: a target is a token count")
    if not 0 < len(spec.display_name) <= 80 or not 0 < len(spec.action) <= 300 or not 0 < len(spec.validation) <= 300:
        raise RegistryError(f"block {spec.id}: display name, action and validation are required (bounded)")
    return spec


_UNATTRIBUTED_SPEC = BlockSpec(
    UNATTRIBUTED,
    "Unattributed prompt surface",
    "turn_context",
    "unknown",
    "unknown",
    "unknown",
    "Label the block (x-wiregate-blocks) or register its id; diagnosis only until then.",
    "None: unattributed material is never an opportunity.",
)

BUILTIN: tuple[BlockSpec, ...] = (
    BlockSpec(
        "prompt.system_instructions",
        "System and developer instructions",
        "instruction",
        "host_policy",
        "direct",
        "until_replaced",
        "Remove rules the agent never needs and keep the rest byte-stable so they stay cached.",
        "Task success and rule adherence on the host's evaluation sessions unchanged.",
        singleton=True,
    ),
    BlockSpec(
        "prompt.tool_schemas",
        "Tool schemas",
        "reference",
        "host_policy",
        "direct",
        "until_replaced",
        "Offer only the tools a step can use and shorten their descriptions.",
        "Tool-call success rate and argument validity unchanged.",
        singleton=True,
    ),
    BlockSpec(
        "wiregate.prepared_context",
        "Prepared context (context layer)",
        "reference",
        "host_generated",
        "assembly",  # framing by wiregate, items from the store: mixed, so never direct
        "until_replaced",
        "Lower max_bytes or sharpen the query of /v1/context/prepare.",
        "Answer quality on the scope's evaluation set unchanged; receipts show no required item omitted.",
        target=256,
        singleton=True,
        compactable=True,
    ),
    BlockSpec(
        "prompt.history.user_turn",
        "Earlier user turns",
        "turn_context",
        "user_task_payload",
        "assembly",
        "until_replaced",
        "None (user payload): kept in the ledger for comparison only.",
        "None.",
        compactable=True,
    ),
    BlockSpec(
        "prompt.history.assistant_turn",
        "Earlier assistant turns and tool calls",
        "turn_context",
        "host_generated",
        "assembly",
        "until_replaced",
        "Compact older turns sooner (summarise, drop superseded tool calls).",
        "Follow-up task success unchanged after compaction.",
        compactable=True,
    ),
    BlockSpec(
        "prompt.tool_result",
        "Tool results",
        "reference",
        "host_generated",
        "assembly",  # the host renders tool output: payload and framing mixed
        "until_replaced",
        "Truncate or summarise large tool outputs before they enter the prompt.",
        "Tool-using tasks still succeed; no answer depends on the removed output.",
        compactable=True,
    ),
    BlockSpec(
        "prompt.current_user_turn",
        "Current user turn",
        "turn_context",
        "user_task_payload",
        "none",
        # It stays in the conversation: a continuation of server-side state (Responses
        # `previous_response_id`) is still exposed to it; a full-context request re-sends it
        # as a history turn instead, which ends this instance (see ledger._carry).
        "until_replaced",
        "None (user payload).",
        "None.",
        compactable=True,
    ),
    BlockSpec(
        "host.notice",
        "Host notices and reminders",
        "notice",
        "host_policy",
        "direct",
        "boundary_only",
        "Send the notice only on the turns that need it.",
        "Behaviour the notice guards is unchanged on evaluation sessions.",
        target=0,
    ),
    BlockSpec(
        "host.workspace_configuration",
        "Workspace configuration",
        "instruction",
        "workspace_configuration",
        "assembly",
        "session_persistent",
        "Assemble workspace configuration once per session, deduplicated (lossless only).",
        "The assembled text is byte-for-byte what the workspace provides.",
    ),
    BlockSpec(
        "host.compaction_summary",
        "Compaction summary",
        "reference",
        "host_generated",
        "direct",
        "until_replaced",
        "Tighten the summary prompt.",
        "Follow-up task success after compaction unchanged.",
        singleton=True,
        compacts=True,
    ),
)


class Registry:
    """Block ids to their specs; anything else reads as `unattributed.prompt_surface`."""

    def __init__(self, specs: Iterable[BlockSpec]) -> None:
        by_id: dict[str, BlockSpec] = {UNATTRIBUTED: _UNATTRIBUTED_SPEC}
        for spec in specs:
            check(spec)
            if spec.id in by_id:
                raise RegistryError(f"block id {spec.id!r} is registered twice")
            by_id[spec.id] = spec
        self._by_id = by_id

    def resolve(self, block_id: str) -> BlockSpec:
        """The spec of a (possibly host-supplied) id: unknown or path-like → unattributed."""
        spec = self._by_id.get(block_id)
        if spec is None or not well_formed_id(block_id):
            return self._by_id[UNATTRIBUTED]
        return spec

    def get(self, block_id: str) -> BlockSpec | None:
        return self._by_id.get(block_id)

    def __iter__(self) -> Any:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)


def spec_from(entry: Mapping[str, Any]) -> BlockSpec:
    """A configured entry (the `[[attribution.blocks]]` table) as a checked spec."""
    return check(
        BlockSpec(
            id=str(entry["id"]),
            display_name=str(entry["display_name"]),
            type=entry["type"],
            origin=entry["origin"],
            control=entry["control"],
            lifetime=entry["lifetime"],
            action=str(entry["action"]),
            validation=str(entry["validation"]),
            target=entry.get("target"),
            singleton=bool(entry.get("singleton", False)),
            compactable=bool(entry.get("compactable", False)),
            compacts=bool(entry.get("compacts", False)),
        )
    )


def build(extra: Iterable[Mapping[str, Any]] = ()) -> Registry:
    """The built-in registry extended by configured entries (which may not redefine one)."""
    return Registry((*BUILTIN, *(spec_from(e) for e in extra)))
