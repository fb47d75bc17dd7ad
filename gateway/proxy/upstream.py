"""Talking to providers: one pooled ClientSession, attempts, retries, backoff.

Owns: building the upstream request for a target (URL from the profile only, credential
from the profile only, an allow-list of forwarded headers), per-profile timeouts, never
following redirects, retrying connection errors and retryable statuses with backoff that
honours `retry-after-ms` / `retry-after` (a request that may have reached the provider —
its connection broke after it was sent — only when the profile's `resend_after_reset`
says so), and translating client-library exceptions into content-free outcomes at this
boundary. Cancellation (a client that went away) propagates
and closes the upstream connection.
Must not: decide about content, fallbacks or release (flow.py does).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from gateway.checks.destination import Target
from gateway.config.runtime import LoadedProfile
from gateway.errors import ClientError
from gateway.hop import NEVER_PASSED, connection_listed
from gateway.profiles.model import UpstreamProfile
from gateway.vocab import AttemptOutcome, ReasonCode

USER_AGENT = "wiregate/0.1"
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(slots=True)
class AttemptRecord:
    """One upstream attempt, for usage accounting and logs (no content)."""

    profile_id: str
    attempt: int
    outcome: AttemptOutcome
    status: int | None = None
    seconds: float = 0.0


@dataclass(slots=True)
class Sent:
    """The outcome of sending to one profile (after its retries)."""

    response: aiohttp.ClientResponse | None  # headers received, body not yet read
    failure: str | None = None  # a reason code when no response could be had
    attempts: list[AttemptRecord] = field(default_factory=list)
    until: float = float("inf")  # monotonic end of the attempt: the profile's total_s, the call's deadline
    # An attempt that got no answer may have reached the provider (see `_reached`): the
    # request is then resent — by a retry or a fallback profile — only under the profile's
    # `retry.resend_after_reset`.
    reached: bool = False

    def timed_out(self) -> None:
        """The send was stopped by a deadline (the profile's total, the call's): no
        response, the attempt under way a timeout (one that may have reached the provider);
        the attempts before it still count."""
        if self.response is not None:
            self.response.close()
            self.response = None
        self.failure = ReasonCode.UPSTREAM_TIMEOUT
        if self.attempts and self.attempts[-1].outcome == AttemptOutcome.RESPONSE and self.attempts[-1].status is None:
            self.attempts[-1].outcome = AttemptOutcome.TIMEOUT
            self.reached = True


def upstream_headers(
    profile: UpstreamProfile, credential: str | None, client_headers: Mapping[str, str]
) -> dict[str, str]:
    """The headers that leave: our own, the profile's credential, and only the client
    headers the profile allows. The caller's gateway key is never among them.

    A client value that leaves must be printable ASCII (or tab): the server reads a byte
    that is not UTF-8 as a lone surrogate, the check reads that text, and the client writer
    drops the surrogate on the wire — so `sec\\xffret` would be checked as two harmless
    halves and sent whole. Such a value is refused (400 `invalid_request`), never cleaned.

    A client header its Connection header lists is hop-by-hop (RFC 9110 §7.6.1) and never
    leaves; nor does a framing, hop-by-hop or credential name, even one a profile lists
    (the profile model refuses those at load)."""
    listed = connection_listed(client_headers)
    headers = {"content-type": "application/json", "user-agent": USER_AGENT}
    if profile.provider == "anthropic":
        version = client_headers.get("anthropic-version", ANTHROPIC_VERSION)
        headers["anthropic-version"] = _forwardable(ANTHROPIC_VERSION if "anthropic-version" in listed else version)
        if credential:
            headers["x-api-key"] = credential
    elif credential:
        headers["authorization"] = f"Bearer {credential}"
    for name in profile.passthrough_headers:
        if name in NEVER_PASSED or name in listed or name in headers:
            continue  # nor one the gateway sets itself (its user agent, the version it chose)
        value = client_headers.get(name)
        if value is not None:
            headers[name] = _forwardable(value)
    return headers


_PRINTABLE = re.compile(r"[\t\x20-\x7e]*")


def _forwardable(value: str) -> str:
    if _PRINTABLE.fullmatch(value) is None:
        raise ClientError(400, "invalid_request", (ReasonCode.INVALID_REQUEST,))
    return value


def retry_delay(
    headers: Mapping[str, str],
    attempt: int,
    initial_ms: int,
    max_ms: int,
    jitter: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before the next attempt: the provider's hint when it gives one,
    else exponential backoff with jitter."""
    hint = _retry_after(headers)
    if hint is not None:
        return hint
    base: float = min(max_ms, initial_ms * (2**attempt)) / 1000.0
    return base * (0.5 + 0.5 * float(jitter()))


def _retry_after(headers: Mapping[str, str]) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _failure(exc: BaseException) -> str:
    """The reason code for an attempt that got no response headers. A connection that
    broke once it was open (the request written, or being written) is `upstream_reset`:
    unlike one that could not be opened, the provider may have received the request."""
    if isinstance(exc, TimeoutError):
        return ReasonCode.UPSTREAM_TIMEOUT
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ReasonCode.UPSTREAM_UNAVAILABLE
    return ReasonCode.UPSTREAM_RESET


def _reached(exc: BaseException) -> bool:
    """May the provider have received the request of an attempt that failed with `exc`?
    Not when its connection could not be opened (refused, unresolvable, a failed TLS
    handshake, the connect timeout); otherwise it may: a connection that broke, or a read
    timeout while the provider, holding the whole request, had not answered yet."""
    return not isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))


class Upstream:
    """The client side of every provider call (one per app, under `UPSTREAM`)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def send(
        self,
        target: Target,
        loaded: LoadedProfile,
        body: bytes,
        headers: Mapping[str, str],
        *,
        deadline: float,
        into: Sent | None = None,
    ) -> Sent:
        """Send with the profile's retry policy. Returns the first non-retryable response
        (or the last one when retries run out, or when the wait before the next attempt
        would not end before `deadline`), or a failure reason. `into`: the record to fill
        as attempts are made (a caller that cancels the send still holds what was tried)."""
        profile = loaded.profile
        policy = profile.retry
        timeout = aiohttp.ClientTimeout(
            total=None, connect=profile.timeouts.connect_s, sock_read=profile.timeouts.read_s
        )
        sent = into if into is not None else Sent(response=None)
        for attempt in range(policy.attempts + 1):
            started = time.monotonic()
            record = AttemptRecord(profile.id, attempt, AttemptOutcome.RESPONSE)
            sent.attempts.append(record)
            last = attempt == policy.attempts
            try:
                response = await self.session.post(
                    target.url,
                    data=body,
                    headers=dict(headers),
                    allow_redirects=False,
                    timeout=timeout,
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                timed_out = isinstance(exc, TimeoutError)
                record.outcome = AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.CONNECTION_ERROR
                record.seconds = time.monotonic() - started
                sent.failure = _failure(exc)
                reached = _reached(exc)
                sent.reached = sent.reached or reached
                allowed = policy.resend_after_reset if reached else policy.on_connection_error
                if last or not allowed:
                    return sent
                delay = retry_delay({}, attempt, policy.backoff_initial_ms, policy.backoff_max_ms)
                if time.monotonic() + delay >= deadline:
                    return sent
            else:
                record.status = response.status
                record.seconds = time.monotonic() - started
                if last or not self._should_retry(response, policy.statuses):
                    sent.response, sent.failure = response, None
                    return sent
                hint = _retry_after(response.headers)
                delay = retry_delay(response.headers, attempt, policy.backoff_initial_ms, policy.backoff_max_ms)
                too_long = hint is not None and hint > policy.max_retry_after_s
                if too_long or time.monotonic() + delay >= deadline:
                    sent.response, sent.failure = response, None  # give back what we have
                    return sent
                record.outcome = AttemptOutcome.RETRY
                response.close()
                sent.failure = None
            await asyncio.sleep(delay)
        return sent

    async def get(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        params: Mapping[str, str],
        client_timeout: aiohttp.ClientTimeout,
        limit: int,
    ) -> tuple[int, bytes] | None:
        """One bounded GET without a body (a provider's model list): (status, body), or
        None when no complete answer of at most `limit` bytes could be had. No retries."""
        try:
            async with self.session.get(
                url, headers=dict(headers), params=dict(params), allow_redirects=False, timeout=client_timeout
            ) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_any():
                    size += len(chunk)
                    if size > limit:
                        return None
                    chunks.append(chunk)
                return response.status, b"".join(chunks)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    @staticmethod
    def _should_retry(response: aiohttp.ClientResponse, statuses: tuple[int, ...]) -> bool:
        if response.headers.get("x-should-retry", "").lower() == "false":
            return False
        return response.status in statuses


UPSTREAM = web.AppKey("wiregate_upstream", Upstream)  # set by the app's upstream cleanup context
