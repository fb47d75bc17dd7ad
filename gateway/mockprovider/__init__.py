"""Bundled mock LLM provider: fakes the OpenAI and Anthropic HTTP APIs for tests.

Deterministic output, per-request control through scenarios (a ``mock-scenario:X``
marker anywhere in the request body), fault injection, and a record of every
request received.  See `state.Step` for the step fields.  Prompt caching is emulated
the way the providers report it (Anthropic breakpoints, OpenAI implicit prefixes); see
`cache` for the rules and `MockState` for the knobs.
"""

from .app import create_app
from .cache import CacheUsage
from .content import content_digest
from .server import MockProviderServer, serve_forever
from .state import MockState, RequestRecord, Step, StepError, ToolCallSpec
from .usage import compute_usage

__all__ = [
    "CacheUsage",
    "MockProviderServer",
    "MockState",
    "RequestRecord",
    "Step",
    "StepError",
    "ToolCallSpec",
    "compute_usage",
    "content_digest",
    "create_app",
    "serve_forever",
]
