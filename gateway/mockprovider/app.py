"""The mock provider's aiohttp application: routes, auth, scenario choice, recording.

Each ``/v1`` request is recorded first, then answered:

1. auth (when an API key is configured) -> 401 in the route's dialect;
2. the scenario named by a ``mock-scenario:X`` marker in the raw body supplies the
   next `Step` (unknown id -> 400; no marker -> the default step);
3. ``raw_events`` / ``raw_body`` / an error status short-circuit generation;
4. otherwise the prompt cache is consulted and updated (chat, responses, messages;
   isolated per presented API key), the route's wire module renders the answer, and
   `delivery` writes it.

Admin routes live under ``/_mock`` and are not recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from aiohttp import web

from . import anthropic_wire, openai_wire
from .cache import BreakpointError
from .content import derive_id, plan_generation
from .delivery import deliver
from .prompt import anthropic_cache_query, anthropic_units, openai_cache_query
from .reply import JSON_CONTENT_TYPE, SSE_CONTENT_TYPE, Reply, WireError, json_reply
from .state import MockState, Step, StepError, find_scenario_marker, validate_scenario_id

Dialect = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Caller:
    """Who is asking: the shared state and the API key presented ("" if none), which
    isolates prompt-cache entries like a provider workspace does."""

    state: MockState
    workspace: str


Answer = Callable[[Mapping[str, Any], Step, Caller], Reply]

STATE_KEY: web.AppKey[MockState] = web.AppKey("mockprovider_state", MockState)
INFLIGHT_KEY: web.AppKey[set[asyncio.Task[Any]]] = web.AppKey("mockprovider_inflight", set)

MAX_REQUEST_BYTES = 64 * 1024 * 1024
_REQUEST_ID_HEADER: Mapping[Dialect, str] = MappingProxyType({"openai": "x-request-id", "anthropic": "request-id"})


@dataclass(frozen=True)
class Endpoint:
    """One provider route: its error dialect and how to answer a valid request."""

    dialect: Dialect
    answer: Answer
    needs_json: bool = True


# -- answering valid requests ---------------------------------------------------------


def _is_stream(request_json: Mapping[str, Any]) -> bool:
    return request_json.get("stream") is True


def _require_messages(request_json: Mapping[str, Any]) -> None:
    if not isinstance(request_json.get("messages"), list):
        raise WireError(400, "'messages' must be a list")


def _answer_chat(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    _require_messages(request_json)
    gen = plan_generation("openai_chat", request_json, step)
    query = openai_cache_query("openai_chat", request_json, caller.workspace)
    cache = caller.state.openai_cache(query)
    return openai_wire.chat_reply(request_json, gen, stream=_is_stream(request_json), cache=cache)


def _answer_responses(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    gen = plan_generation("openai_responses", request_json, step)
    query = openai_cache_query("openai_responses", request_json, caller.workspace)
    cache = caller.state.openai_cache(query)
    return openai_wire.responses_reply(request_json, gen, stream=_is_stream(request_json), cache=cache)


def _answer_embeddings(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    return openai_wire.embeddings_reply(request_json, omit_usage=step.omit_usage)


def _answer_models(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    return openai_wire.models_reply()


def _answer_anthropic_models(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    return anthropic_wire.models_reply(openai_wire.MODEL_IDS)


def _answer_messages(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    _require_messages(request_json)
    gen = plan_generation("anthropic", request_json, step)
    try:
        query = anthropic_cache_query(request_json, caller.workspace)
    except BreakpointError as error:
        raise WireError(400, str(error)) from error
    cache = caller.state.anthropic_cache(query)
    return anthropic_wire.messages_reply(request_json, gen, stream=_is_stream(request_json), cache=cache)


def _answer_count_tokens(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    """The input tokens the Messages request would use, by the mock's own tokenizer (the
    sum of its prompt units; caching plays no part, as at Anthropic)."""
    _require_messages(request_json)
    return json_reply({"input_tokens": sum(unit.tokens for unit in anthropic_units(request_json))})


def _answer_unknown_route(request_json: Mapping[str, Any], step: Step, caller: Caller) -> Reply:
    raise WireError(404, "Unknown mock provider route.")


ENDPOINTS: Mapping[tuple[str, str], Endpoint] = MappingProxyType(
    {
        ("POST", "/v1/chat/completions"): Endpoint("openai", _answer_chat),
        ("POST", "/v1/responses"): Endpoint("openai", _answer_responses),
        ("POST", "/v1/embeddings"): Endpoint("openai", _answer_embeddings),
        ("GET", "/v1/models"): Endpoint("openai", _answer_models, needs_json=False),
        ("POST", "/v1/messages"): Endpoint("anthropic", _answer_messages),
        ("POST", "/v1/messages/count_tokens"): Endpoint("anthropic", _answer_count_tokens),
    }
)
_ANTHROPIC_MODELS = Endpoint("anthropic", _answer_anthropic_models, needs_json=False)
_UNKNOWN_OPENAI = Endpoint("openai", _answer_unknown_route, needs_json=False)
_UNKNOWN_ANTHROPIC = Endpoint("anthropic", _answer_unknown_route, needs_json=False)


# -- errors, auth, request parsing ------------------------------------------------------


def _error_reply(dialect: Dialect, status: int, message: str | None, request_id: str) -> Reply:
    if dialect == "anthropic":
        return json_reply(anthropic_wire.error_payload(status, message, request_id), status)
    return json_reply(openai_wire.error_payload(status, message), status)


def _bearer_token(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _presented_keys(dialect: Dialect, headers: Mapping[str, str]) -> list[str]:
    """Keys the client offered.  Anthropic accepts ``x-api-key`` and also a Bearer token,
    which is what anthropic-sdk-python 2.x sends for ``api_key``."""
    offered = [_bearer_token(headers)]
    if dialect == "anthropic":
        offered.append(headers.get("x-api-key"))
    return [key for key in offered if key is not None]


def _workspace(dialect: Dialect, headers: Mapping[str, str]) -> str:
    """The key that scopes prompt-cache entries: Anthropic's ``x-api-key`` or else the
    Bearer token; "" when the client presented none."""
    if dialect == "anthropic" and headers.get("x-api-key"):
        return headers["x-api-key"]
    return _bearer_token(headers) or ""


def _authorized(dialect: Dialect, headers: Mapping[str, str], api_key: str | None) -> bool:
    if api_key is None:
        return True
    expected = api_key.encode()
    return any(hmac.compare_digest(key.encode(), expected) for key in _presented_keys(dialect, headers))


def _lowercase_headers(request: web.Request) -> dict[str, str]:
    """Header names lower-cased; repeated headers joined with ", " (RFC 9110)."""
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def _parse_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _request_id(body: bytes) -> str:
    return derive_id("req_", hashlib.sha256(body).hexdigest(), "request")


# -- deciding the reply ---------------------------------------------------------------


@dataclass(frozen=True)
class _Incoming:
    endpoint: Endpoint
    headers: Mapping[str, str]
    body: bytes
    parsed: Any
    scenario: str | None
    request_id: str


def _raw_reply(step: Step) -> Reply | None:
    if step.raw_events is not None:
        return Reply(
            status=step.status,
            content_type=step.content_type or SSE_CONTENT_TYPE,
            events=tuple(event.encode() for event in step.raw_events),
        )
    if step.raw_body is not None:
        return Reply(
            status=step.status,
            content_type=step.content_type or JSON_CONTENT_TYPE,
            body=step.raw_body.encode(),
        )
    return None


def _generated_reply(state: MockState, incoming: _Incoming, step: Step) -> Reply:
    dialect = incoming.endpoint.dialect
    if step.is_error:
        return _error_reply(dialect, step.status, step.error_message, incoming.request_id)
    request_json: Mapping[str, Any] = {}
    if incoming.endpoint.needs_json:
        if not isinstance(incoming.parsed, dict):
            return _error_reply(dialect, 400, "The request body must be a JSON object.", incoming.request_id)
        request_json = incoming.parsed
    try:
        caller = Caller(state, _workspace(dialect, incoming.headers))
        reply = incoming.endpoint.answer(request_json, step, caller)
    except WireError as error:
        return _error_reply(dialect, error.status, error.message, incoming.request_id)
    return dataclasses.replace(reply, status=step.status)


def _decide(state: MockState, incoming: _Incoming) -> tuple[Reply, Step]:
    """Choose the reply (before any I/O) and the step whose timing/faults apply."""
    dialect = incoming.endpoint.dialect
    if not _authorized(dialect, incoming.headers, state.api_key):
        return _error_reply(dialect, 401, "Invalid API key.", incoming.request_id), Step()
    step = state.next_step(incoming.scenario)
    if step is None:
        message = f"Unknown mock scenario {incoming.scenario!r}."
        return _error_reply(dialect, 400, message, incoming.request_id), Step()
    reply = _raw_reply(step) or _generated_reply(state, incoming, step)
    headers = {_REQUEST_ID_HEADER[dialect]: incoming.request_id, **step.headers}
    return dataclasses.replace(reply, headers=headers), step


# -- handlers ------------------------------------------------------------------------


def _endpoint_for(request: web.Request) -> Endpoint:
    if (request.method, request.path) == ("GET", "/v1/models") and "anthropic-version" in request.headers:
        return _ANTHROPIC_MODELS  # the same route answers each provider's SDK in its shape
    endpoint = ENDPOINTS.get((request.method, request.path))
    if endpoint is not None:
        return endpoint
    return _UNKNOWN_ANTHROPIC if request.path.startswith("/v1/messages") else _UNKNOWN_OPENAI


class _RecordProgress:
    """Mirrors delivery progress into the request's record."""

    def __init__(self, state: MockState, seq: int) -> None:
        self._state = state
        self._seq = seq

    def headers_sent(self, status: int) -> None:
        self._state.update_record(self._seq, status=status)

    def writing(self) -> None:
        self._state.update_record(self._seq, last_write_at=time.monotonic())


async def _answer_recorded(request: web.Request, state: MockState, seq: int, incoming: _Incoming) -> web.StreamResponse:
    try:
        reply, step = _decide(state, incoming)
        delivered = await deliver(request, reply, step, _RecordProgress(state, seq))
    except asyncio.CancelledError:
        state.update_record(seq, cancelled=True)
        raise
    state.update_record(seq, finished=delivered.complete, cancelled=delivered.client_gone)
    return delivered.response


async def handle_v1(request: web.Request) -> web.StreamResponse:
    """Record, then answer, any request under ``/v1``."""
    state = request.app[STATE_KEY]
    inflight = request.app[INFLIGHT_KEY]
    task = asyncio.current_task()
    if task is not None:
        inflight.add(task)
    try:
        body = await request.read()
        headers = _lowercase_headers(request)
        parsed = _parse_json(body)
        scenario = find_scenario_marker(body)
        seq = state.open_record(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers=headers,
            body=body,
            parsed=parsed,
            scenario=scenario,
        )
        incoming = _Incoming(_endpoint_for(request), headers, body, parsed, scenario, _request_id(body))
        return await _answer_recorded(request, state, seq, incoming)
    finally:
        if task is not None:
            inflight.discard(task)


async def handle_add_scenario(request: web.Request) -> web.Response:
    try:
        payload = await request.json()
        if not isinstance(payload, dict):
            raise StepError("expected a JSON object with 'id' and 'steps'")
        scenario_id = validate_scenario_id(payload.get("id"))
        request.app[STATE_KEY].add_scenario(scenario_id, payload.get("steps") or [])
    except (StepError, ValueError) as error:
        return web.json_response({"error": str(error)}, status=400)
    return web.json_response({"id": scenario_id, "steps": len(payload["steps"])})


async def handle_clear_scenarios(request: web.Request) -> web.Response:
    request.app[STATE_KEY].remove_scenarios()
    return web.json_response({"cleared": True})


async def handle_list_requests(request: web.Request) -> web.Response:
    records = request.app[STATE_KEY].records()
    return web.json_response({"requests": [record.to_json() for record in records]})


async def handle_clear_requests(request: web.Request) -> web.Response:
    return web.json_response({"cleared": request.app[STATE_KEY].clear()})


async def handle_clear_cache(request: web.Request) -> web.Response:
    return web.json_response({"cleared": request.app[STATE_KEY].clear_cache()})


async def handle_healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _cancel_inflight(app: web.Application) -> None:
    """On shutdown, cancel handlers parked by ``hang`` faults instead of waiting."""
    inflight = app[INFLIGHT_KEY]
    for task in list(inflight):
        task.cancel()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(state: MockState | None = None) -> web.Application:
    """Build the mock provider app around `state` (a fresh `MockState` if None)."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[STATE_KEY] = state if state is not None else MockState()
    app[INFLIGHT_KEY] = set()
    app.on_shutdown.append(_cancel_inflight)
    admin: list[tuple[str, str, Handler]] = [
        ("POST", "/_mock/scenarios", handle_add_scenario),
        ("DELETE", "/_mock/scenarios", handle_clear_scenarios),
        ("GET", "/_mock/requests", handle_list_requests),
        ("DELETE", "/_mock/requests", handle_clear_requests),
        ("DELETE", "/_mock/cache", handle_clear_cache),
        ("GET", "/_mock/healthz", handle_healthz),
    ]
    for method, path, handler in admin:
        app.router.add_route(method, path, handler)
    app.router.add_route("*", "/v1/{tail:.*}", handle_v1)
    return app
