"""Reward-as-a-Service: registered reward functions behind an authenticated JSON batch endpoint.

Why FastAPI + uvicorn (design D5): the service is a thin, CPU-light HTTP shell around async reward
functions; uvicorn's `--workers` gives several processes, FastAPI/pydantic validate the JSON, and
both are already dependencies. Ray Serve would add autoscaling but also a Ray cluster to every
reward deployment and test; the `register_serverless` seam lets a user point the same client at
Ray Serve or a cloud function later without code changes.

Endpoints: `GET /health` (no auth), `GET /metrics` and `POST /v1/score` (bearer token in the
`Authorization` header only), `GET /openapi.json` (no auth: the service's own OpenAPI 3.1 schema,
design D13). Errors are structured: `{"error": {"code", "message", ...}}`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import importlib
import inspect
import json
import logging
import math
import os
import threading
import uuid
from collections import Counter
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollart import checks as check
from rollart.env.trajectory import Trajectory
from rollart.reward.cache import Claim, ResultCache
from rollart.reward.errors import RewardError
from rollart.reward.grading import close_shared_pool
from rollart.reward.protocol import RewardFn, RewardRegistry
from rollart.reward.rules import EnvSuccessReward, FormatReward, MathAnswerReward

log = logging.getLogger(__name__)

CONFIG_ENV = "ROLLART_REWARD_CONFIG"
MAX_WORKERS = 64  # uvicorn processes of one deployment (the command lines check it before binding)
# What a /v1/score answer may take past the request's deadline (D24): serializing the results and
# cancelling what did not finish; a client reading with a timeout of answer_bound_s(...) is never cut off.
ANSWER_MARGIN_S = 1.0
# Reward calls running in their own thread (D29) at once in one worker process; past this, an item
# is answered `busy`: threads stuck in blocking code cannot be killed, only bounded.
MAX_REWARD_THREADS = 64
_REWARD_THREADS = threading.BoundedSemaphore(MAX_REWARD_THREADS)


class ServiceConfig(BaseModel):
    """Settings of one service deployment (passed to every uvicorn worker as JSON in an env var)."""

    registry: str = "rollart.reward.service:default_registry"  # "module:callable" returning a RewardRegistry
    token: str = Field(min_length=8)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=2, ge=1, le=MAX_WORKERS)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)  # D29: was 8 MiB
    max_items: int = Field(default=1024, ge=1)
    max_concurrency: int = Field(default=32, ge=1)
    item_timeout_s: float = Field(default=30.0, gt=0)
    cache_path: str = "reward-cache.sqlite"


class ScoreItem(BaseModel):
    """One trajectory to score under its idempotency key."""

    key: str = Field(min_length=1, max_length=512)
    trajectory: Trajectory


class ScoreRequest(BaseModel):
    """A batch: which reward, which items, and the caller's remaining deadline."""

    reward: str = Field(min_length=1)
    items: list[ScoreItem]
    timeout_s: float | None = Field(default=None, gt=0)
    """The caller's remaining deadline in seconds for the whole batch; the service caps it at its
    `item_timeout_s`, so any positive value is accepted (D24)."""


class ItemResult(BaseModel):
    """The outcome of one item; `timeout`/`busy`/`error` items may be retried with the same key."""

    key: str
    status: Literal["ok", "timeout", "busy", "error"]
    score: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    cached: bool = False
    error: str | None = None


class ScoreResponse(BaseModel):
    """Results in request order."""

    results: list[ItemResult]


class ErrorDetail(BaseModel):
    """What went wrong: a stable `code`, a message naming the field, the value and what is allowed."""

    model_config = {"extra": "allow"}  # e.g. `errors`, `allowed`, `duplicates`, `path`

    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every 4xx of the service has this shape."""

    error: ErrorDetail


class HealthResponse(BaseModel):
    """`GET /health`: liveness and the registered rewards."""

    status: Literal["ok"]
    rewards: list[str]
    pid: int


def answer_bound_s(config: ServiceConfig, timeout_s: float | None) -> float:
    """How long one /v1/score request may take at most: min(timeout_s, item_timeout_s) + ANSWER_MARGIN_S.

    The deadline is the batch's, not each item's in turn (D24): every item of a batch starts at
    once, an item not finished by then is answered `timeout`, so a client that reads with this
    timeout always gets the answer.
    """
    # deps: none
    return min(config.item_timeout_s, timeout_s or math.inf) + ANSWER_MARGIN_S


def openapi_schema(app: FastAPI, registry: RewardRegistry, config: ServiceConfig) -> dict[str, Any]:
    """The service's OpenAPI document, precise enough to fuzz against (design D13).

    `/v1/score` reads its body by hand (size cap before parsing, D6), so FastAPI cannot infer the
    request body; it is added here from `ScoreRequest`, with the registered reward names as an enum
    and `max_items` as `maxItems`, and the bearer-token scheme is declared on the protected routes.
    """
    # deps: fastapi.openapi.utils.get_openapi, ScoreRequest.model_json_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="Reward-as-a-Service: score finished trajectories with a registered reward.")
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    request_schema = ScoreRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(request_schema.pop("$defs", {}))
    request_schema["properties"]["reward"] = {"type": "string", "enum": registry.names(), "title": "Reward"}
    request_schema["properties"]["items"]["maxItems"] = config.max_items
    request_schema["properties"]["timeout_s"]["description"] = (
        f"The caller's remaining deadline for the whole batch, in seconds. Any positive value is accepted and "
        f"capped at the server's item_timeout_s ({config.item_timeout_s:g} s).")
    schemas["ScoreRequest"] = request_schema
    components["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
    score = doc["paths"]["/v1/score"]["post"]
    score["requestBody"] = {"required": True,
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}}}}
    score["description"] = (
        f"Scores every item of the batch at once. The answer arrives within min(timeout_s, item_timeout_s) + "
        f"{ANSWER_MARGIN_S:g} s (item_timeout_s = {config.item_timeout_s:g} s); an item not finished by the "
        f"deadline is answered with status `timeout` and may be retried under the same key.")
    score["x-answer-within-s"] = {"item_timeout_s": config.item_timeout_s, "margin_s": ANSWER_MARGIN_S}
    for path, method in (("/v1/score", "post"), ("/metrics", "get")):
        doc["paths"][path][method]["security"] = [{"bearerAuth": []}]
    return doc


_ERRORS = {"model": ErrorResponse}


def default_registry() -> RewardRegistry:
    """The rule rewards: `math`, `format`, `env_success`."""
    registry = RewardRegistry()
    for fn in (MathAnswerReward(), FormatReward(), EnvSuccessReward()):
        registry.register(fn)
    return registry


def load_registry(path: str) -> RewardRegistry:
    """Import `module:callable` and call it (how each worker process builds its registry)."""
    # AST: AST_PRECONDITION(path.count(":") == 1, got=path, msg="registry is 'module:callable'", exc=RewardError)
    check.precondition(path.count(":") == 1, "registry is 'module:callable'", got=path, exc=RewardError)  # generated #5e90378906
    module, _, attr = path.partition(":")
    registry = getattr(importlib.import_module(module), attr)()
    # VAL: VAL_TYPE(registry, RewardRegistry, exc=RewardError)
    check.of_type("registry", registry, RewardRegistry, exc=RewardError)  # generated #3186e04016
    return registry


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message, **extra}})


class _TooLarge(Exception):
    pass


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


def create_app(registry: RewardRegistry, config: ServiceConfig) -> FastAPI:
    """Build the app for one worker process (its own cache connection, semaphore and counters)."""
    # deps: ResultCache, RewardRegistry.get, score_item
    # VAL: VAL_NON_EMPTY(registry.names(), name="reward names of the registry", exc=RewardError)
    check.non_empty("reward names of the registry", registry.names(), exc=RewardError)  # generated #3a916e0846
    owner = f"{os.getpid()}:{uuid.uuid4().hex[:8]}"
    cache = ResultCache(config.cache_path, owner)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        cache.close()
        close_shared_pool()

    app = FastAPI(title="rollart reward service", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", lifespan=lifespan)
    app.openapi = lambda: app.openapi_schema or _cache_schema(app, openapi_schema(app, registry, config))
    metrics: Counter[str] = Counter()
    in_flight = {"requests": 0}
    expected = config.token.encode()

    def authorized(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        return hmac.compare_digest(token.encode(), expected)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail), path=request.url.path)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> dict[str, Any]:
        return {"status": "ok", "rewards": registry.names(), "pid": os.getpid()}

    @app.get("/metrics", response_class=JSONResponse,
             responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}, 401: _ERRORS})
    async def get_metrics(request: Request) -> JSONResponse:
        if not authorized(request):
            metrics["rejected_auth"] += 1
            return _error(401, "unauthorized", "missing or wrong bearer token")
        return JSONResponse({"pid": os.getpid(), "in_flight": in_flight["requests"], **metrics})

    @app.post("/v1/score", response_class=JSONResponse,
              responses={200: {"model": ScoreResponse}, 401: _ERRORS, 404: _ERRORS, 413: _ERRORS, 422: _ERRORS,
                         429: _ERRORS})
    async def score(request: Request) -> JSONResponse:
        metrics["requests"] += 1
        if not authorized(request):
            metrics["rejected_auth"] += 1
            return _error(401, "unauthorized", "missing or wrong bearer token")
        if in_flight["requests"] >= config.max_concurrency:
            metrics["rejected_busy"] += 1
            resp = _error(429, "overloaded", f"{config.max_concurrency} requests already in flight; retry later")
            resp.headers["Retry-After"] = "1"
            return resp
        in_flight["requests"] += 1
        try:
            return await _score(request)
        finally:
            in_flight["requests"] -= 1

    async def _score(request: Request) -> JSONResponse:
        try:
            body = await _read_limited(request, config.max_body_bytes)
        except _TooLarge:
            metrics["rejected_size"] += 1
            return _error(413, "payload_too_large", f"body exceeds max_body_bytes={config.max_body_bytes}")
        try:
            req = ScoreRequest.model_validate_json(body, strict=True)  # what the schema says, no coercion (D13)
        except ValidationError as exc:
            metrics["rejected_invalid"] += 1
            errors = [
                {"field": ".".join(str(p) for p in e["loc"]) or "<body>", "message": e["msg"], "value": repr(e.get("input"))[:200]}
                for e in exc.errors()[:20]
            ]  # fmt: skip
            return _error(422, "invalid_request", "the body does not match ScoreRequest", errors=errors)
        if len(req.items) > config.max_items:
            metrics["rejected_size"] += 1
            return _error(413, "too_many_items", f"items has {len(req.items)} entries, max_items={config.max_items}")
        if req.reward not in registry.names():
            return _error(404, "unknown_reward", f"reward must be one of {registry.names()}, got {req.reward!r}",
                          allowed=registry.names())  # fmt: skip
        keys = [item.key for item in req.items]
        if len(set(keys)) != len(keys):
            dups = sorted({k for k in keys if keys.count(k) > 1})[:10]
            return _error(422, "duplicate_keys", f"item keys must be unique, duplicates {dups}", duplicates=dups)
        timeout = min(config.item_timeout_s, req.timeout_s or math.inf)
        fn = registry.get(req.reward)
        results = await score_batch(fn, cache, req.items, timeout)
        for r in results:
            metrics[f"items_{r.status}"] += 1
            metrics["cache_hits"] += int(r.cached)
        return JSONResponse(ScoreResponse(results=list(results)).model_dump(mode="json"))

    return app


def _cache_schema(app: FastAPI, doc: dict[str, Any]) -> dict[str, Any]:
    app.openapi_schema = doc
    return doc


async def score_batch(fn: RewardFn, cache: ResultCache, items: list[ScoreItem], timeout_s: float) -> list[ItemResult]:
    """Score every item at once under one deadline for the batch (D24), results in request order.

    Each item's own reward call is bounded by `timeout_s` (`score_item`); what still runs half the
    margin past it (a claim stuck behind the cache's threads, a reward that swallows cancellation) is
    cancelled and answered `timeout`, so the whole request ends within `answer_bound_s`.
    """
    # deps: score_item
    # VAL: VAL_TIMEOUT(timeout_s, exc=RewardError)
    check.timeout("timeout_s", timeout_s, exc=RewardError)  # generated #cc70f04010
    if not items:
        return []
    tasks = [asyncio.ensure_future(score_item(fn, cache, item, timeout_s)) for item in items]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s + ANSWER_MARGIN_S / 2)
    loop = asyncio.get_running_loop()
    for item, task in zip(items, tasks):
        if task in pending:  # its claim goes now: a retry may compute the item; a late result is not stored
            task.cancel()
            loop.run_in_executor(None, cache.release, item.key)
    if pending:
        log.warning("reward %s: %d of %d items still running at the batch deadline of %.3g s; answered timeout",
                    fn.name, len(pending), len(items), timeout_s)
    return [task.result() if task in done else
            ItemResult(key=item.key, status="timeout", error=f"the batch's deadline of {timeout_s:.3g} s passed")
            for item, task in zip(items, tasks)]


async def _claim(cache: ResultCache, key: str) -> Claim:
    """`cache.claim` in a thread; if the caller is cancelled meanwhile, a claim it got is released."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, cache.claim, key)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(lambda f: _release_if_claimed(loop, cache, key, f))
        raise


def _release_if_claimed(loop: asyncio.AbstractEventLoop, cache: ResultCache, key: str, future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None and future.result().outcome == "claimed":
        loop.run_in_executor(None, cache.release, key)


async def score_item(fn: RewardFn, cache: ResultCache, item: ScoreItem, timeout_s: float) -> ItemResult:
    """Score one item at most once per key: reuse a stored result, wait for a live owner, or compute.

    The reward call is bounded by `timeout_s`; on timeout or error the claim is released so a retry
    can compute it, and nothing is stored.
    """
    # deps: ResultCache.claim, ResultCache.complete, ResultCache.release
    # VAL: VAL_TIMEOUT(timeout_s, exc=RewardError)
    check.timeout("timeout_s", timeout_s, exc=RewardError)  # generated #cc70f04010
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        claim = await _claim(cache, item.key)
        if claim.outcome == "done":
            return ItemResult(key=item.key, status="ok", cached=True, **claim.result)
        if claim.outcome == "claimed":
            break
        if loop.time() + 0.05 > deadline:
            return ItemResult(key=item.key, status="busy", error="another worker is scoring this key")
        await asyncio.sleep(0.05)
    if not runs_on_loop(fn) and not _REWARD_THREADS.acquire(blocking=False):
        await asyncio.to_thread(cache.release, item.key)
        return ItemResult(key=item.key, status="busy", error=f"{MAX_REWARD_THREADS} reward calls still running")
    call = fn.score(item.trajectory) if runs_on_loop(fn) else _score_in_thread(fn, item.trajectory)
    try:
        result = await asyncio.wait_for(call, timeout=max(1e-3, deadline - loop.time()))
    except TimeoutError:
        await asyncio.to_thread(cache.release, item.key)
        return ItemResult(key=item.key, status="timeout", error=f"reward did not finish within {timeout_s:.3g} s")
    except Exception as exc:
        log.warning("reward %s failed on %s", fn.name, item.key, exc_info=exc)
        await asyncio.to_thread(cache.release, item.key)
        return ItemResult(key=item.key, status="error", error=f"{type(exc).__name__}: {exc}"[:500])
    await asyncio.to_thread(cache.complete, item.key, float(result.score), result.details)
    return ItemResult(key=item.key, status="ok", score=float(result.score), details=result.details)


def runs_on_loop(fn: RewardFn) -> bool:
    """Whether the service awaits `fn.score` on its event loop: only when `fn` declares `runs_on_loop = True`.

    Why not every async reward (D29): one `time.sleep(40)` in a user's `async def score` held the
    loop for 40 s; /health timed out and the item came back `ok` past its 2 s deadline. A function
    may declare that it never blocks (the rule rewards, the judge and the function rewards here do,
    and must then keep that promise); every other one runs in a thread of its own.
    """
    # deps: none
    return bool(getattr(fn, "runs_on_loop", False)) and inspect.iscoroutinefunction(fn.score)


def _score_in_thread(fn: RewardFn, trajectory: Trajectory) -> asyncio.Future:
    """`fn.score(trajectory)` in a daemon thread with its own event loop (a plain `def score` works too).

    Returns a future of the service's loop. Cancelling it (the deadline) cancels the coroutine in
    its loop; code that blocks goes on in its thread, but the item is answered at the deadline, the
    thread is a daemon (it cannot hold a shutdown) and counts against `MAX_REWARD_THREADS` until it ends.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    inner: dict[str, Any] = {}

    def deliver(result: Any, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(result)

    async def call() -> Any:
        inner["task"], inner["loop"] = asyncio.current_task(), asyncio.get_running_loop()
        result = fn.score(trajectory)
        return await result if inspect.isawaitable(result) else result

    def run() -> None:
        try:
            result, exc = asyncio.run(call()), None
        except BaseException as err:  # noqa: BLE001 - delivered to the awaiting item, whatever it is
            result, exc = None, err
        finally:
            _REWARD_THREADS.release()
        with contextlib.suppress(RuntimeError):  # the service's loop closed meanwhile
            loop.call_soon_threadsafe(deliver, result, exc)

    def cancel_inner(f: asyncio.Future) -> None:
        if f.cancelled() and "task" in inner:
            with contextlib.suppress(RuntimeError):
                inner["loop"].call_soon_threadsafe(inner["task"].cancel)

    future.add_done_callback(cancel_inner)
    threading.Thread(target=run, daemon=True, name=f"reward-{fn.name}").start()
    return future


def app_from_env() -> FastAPI:
    """The uvicorn factory each worker process calls: config from `ROLLART_REWARD_CONFIG`."""
    # deps: load_registry, create_app
    raw = os.environ.get(CONFIG_ENV)
    # AST: AST_PRECONDITION(raw is not None, got=CONFIG_ENV, msg="the service config is set in the environment", exc=RewardError)
    check.precondition(raw is not None, "the service config is set in the environment", got=CONFIG_ENV, exc=RewardError)  # generated #63653c573a
    config = ServiceConfig.model_validate_json(raw)
    return create_app(load_registry(config.registry), config)


def serve(config: ServiceConfig) -> None:
    """Run the service (blocking) with `config.workers` uvicorn worker processes."""
    # deps: app_from_env, uvicorn.run
    import uvicorn

    os.environ[CONFIG_ENV] = config.model_dump_json()
    uvicorn.run(
        "rollart.reward.service:app_from_env",
        factory=True,
        host=config.host,
        port=config.port,
        workers=config.workers,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m rollart.reward.service --token ... [--port 8000 --workers 2 --registry mod:fn]`."""
    parser = argparse.ArgumentParser(description="rollart Reward-as-a-Service")
    parser.add_argument("--config-json", default=None, help="a full ServiceConfig as JSON")
    parser.add_argument("--token", default=os.environ.get("ROLLART_REWARD_TOKEN"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--registry", default="rollart.reward.service:default_registry")
    parser.add_argument("--cache-path", default="reward-cache.sqlite")
    args = parser.parse_args(argv)
    if args.config_json:
        config = ServiceConfig.model_validate(json.loads(args.config_json))
    else:
        config = ServiceConfig(token=args.token or "", host=args.host, port=args.port, workers=args.workers,
                               registry=args.registry, cache_path=args.cache_path)  # fmt: skip
    serve(config)


if __name__ == "__main__":
    main()
