"""Carriers: one pure module per wire schema, listed explicitly in `CARRIERS`.

Adding a provider schema is one module, one test file and one line here: routes, short
names, capabilities and CLI choices are derived from this registry.
"""

from gateway.carriers.anthropic_count_tokens import AnthropicCountTokens
from gateway.carriers.anthropic_messages import AnthropicMessages
from gateway.carriers.base import Carrier
from gateway.carriers.openai_chat import OpenAIChat
from gateway.carriers.openai_embeddings import OpenAIEmbeddings
from gateway.carriers.openai_responses import OpenAIResponses

CARRIERS: dict[str, Carrier] = {
    "openai.chat": OpenAIChat(),
    "openai.responses": OpenAIResponses(),
    "openai.embeddings": OpenAIEmbeddings(),
    "anthropic.messages": AnthropicMessages(),
    "anthropic.count_tokens": AnthropicCountTokens(),
}

# Profile `carriers` entries use the short names from SPEC §4. A carrier that shares its
# short name with an earlier one is another endpoint of the same schema (Anthropic's token
# counting): the profile entry grants both, and the first listed owns the name.
SHORT_NAMES: dict[str, str] = {c.short_name: name for name, c in reversed(CARRIERS.items())}

# The gateway's provider routes, each served by its carrier.
ROUTES: dict[str, str] = {carrier.route: name for name, carrier in CARRIERS.items()}

__all__ = ["CARRIERS", "ROUTES", "SHORT_NAMES", "Carrier"]
