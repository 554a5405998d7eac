"""The client of a serverless function endpoint (Reward-as-a-Service and the like).

Why httpx (design D9): one async client with a clean timeout model, already a dependency. The
client is an async callable installed as a worker attribute by ``register_serverless``; it must
pickle (Ray ships it to actors), so the HTTP connection pool is created lazily per event loop.
Retries: transport errors, timeouts and 5xx are retried with exponential backoff and equal jitter
(the shared policy of `rollart.resource.retry`: clients that failed together do not retry together);
a 4xx is the caller's fault and is not retried. The endpoint contract is plain JSON POST -> JSON response.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from rollart import checks as check
from rollart.resource.errors import ResourceError, ServerlessError
from rollart.resource.retry import Backoff, retrying

__all__ = ["ServerlessClient", "redact_url"]

_SECRET_WORDS = ("token", "key", "secret", "password", "signature", "auth")


def redact_url(url: str) -> str:
    """The URL with secret-looking query values and userinfo replaced by ``***`` (for the store, logs, errors)."""
    # deps: urllib.parse
    parts = urlsplit(url)
    query = urlencode([(k, "***" if any(w in k.lower() for w in _SECRET_WORDS) else v)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class ServerlessClient:
    """An async callable that POSTs JSON to a function endpoint, with per-attempt timeouts and backoff.

    Example:
        ```python
        judge = ServerlessClient("http://127.0.0.1:8000/reward", timeout=5.0, retries=2)
        score = await judge({"prompt": "...", "response": "..."})
        ```
    """

    def __init__(self, url: str, *, timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, headers: Mapping[str, str] | None = None) -> None:
        """Keep the settings only; the HTTP pool is made lazily per event loop so the client pickles.

        ``headers`` (e.g. ``{"Authorization": "Bearer ..."}``) go with every request and are never
        written to the metadata store.
        """
        # deps: none
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        # VAL: VAL_INT_RANGE(retries, min=0, max=100, exc=ResourceError)
        check.int_range("retries", retries, min=0, max=100, exc=ResourceError)  # generated #b572bd3688
        # VAL: VAL_NON_NEGATIVE(backoff, exc=ResourceError)
        check.non_negative("backoff", backoff, exc=ResourceError)  # generated #a46bfb2008
        # AST: AST_PRECONDITION(url.startswith(("http://", "https://")), got=url, msg="url must be an http(s) URL", exc=ResourceError)
        check.precondition(url.startswith(("http://", "https://")), "url must be an http(s) URL", got=url, exc=ResourceError)  # generated #f8fa014c8a
        self.url = url
        self.timeout = float(timeout)
        self.retries = retries
        self.backoff = float(backoff)
        self._policy = Backoff(base_s=self.backoff, max_s=self.backoff * 2 ** max(retries - 1, 0), jitter="equal")
        self._rng = random.Random()
        self.headers = dict(headers or {})
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_loop"] = None
        return state

    def __repr__(self) -> str:
        return f"ServerlessClient({redact_url(self.url)!r}, timeout={self.timeout}, retries={self.retries})"

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # plain http needs no TLS context (building one loads the CA bundle: ~1 s on a busy machine)
            verify = self.url.startswith("https://")
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), verify=verify, headers=self.headers)
            self._loop = loop
        return self._client

    async def __call__(self, payload: Any) -> Any:
        """POST payload as JSON and return the decoded JSON; retry transport errors, timeouts and 5xx."""
        # deps: httpx.AsyncClient.post, retrying (rollart.resource.retry)
        client = self._http()
        url = redact_url(self.url)
        policy = retrying(self._policy, self._rng, retry_on=(_Failed,), max_attempts=self.retries + 1,
                          give_up=lambda attempts, error: ServerlessError(url, attempts, str(error)))
        async for attempt in policy:
            with attempt:
                number = attempt.retry_state.attempt_number
                try:
                    response = await asyncio.wait_for(client.post(self.url, json=payload), self.timeout)
                except (TimeoutError, httpx.TimeoutException) as exc:
                    raise _Failed(f"attempt timed out after timeout={self.timeout}s ({type(exc).__name__})") from exc
                except httpx.TransportError as exc:
                    raise _Failed(f"{type(exc).__name__}: {exc}") from exc
                if response.status_code >= 500:
                    raise _Failed(f"HTTP {response.status_code}: {response.text[:200]}")
                if response.status_code >= 400:
                    raise ServerlessError(url, number, f"HTTP {response.status_code} is a client error, not "
                                                       f"retried: {response.text[:200]}")
                try:
                    return response.json()
                except ValueError:
                    raise ServerlessError(url, number, f"response is not JSON: {response.text[:200]!r}") from None
        raise AssertionError("unreachable: the retry loop returns or raises")

    async def aclose(self) -> None:
        """Close the HTTP pool (a later call opens a new one)."""
        # deps: none
        if self._client is not None:
            await self._client.aclose()
        self._client = None
        self._loop = None


class _Failed(Exception):
    """One attempt failed in a way worth retrying (transport, timeout, 5xx); the message says how."""
