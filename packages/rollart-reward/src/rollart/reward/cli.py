"""`rollart-reward serve SPEC`: serve one reward function over HTTP with the reward package alone.

Why a command here and not only in the application (design D25): a reward service runs on its own
machines, and `rollart reward serve` needed rollart-app (the whole training stack) to be installed.
Why argparse: rollart-reward has no typer, and one subcommand does not justify a dependency.
Why `serve_command` is the one body: the application's `rollart reward serve` calls it too, so the
two commands check the same options, say the same words and exit with the same codes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart import checks as check
from rollart.reward.errors import RewardError
from rollart.reward.function_service import load_reward, serve_function
from rollart.reward.service import MAX_WORKERS

TOKEN_ENV = "ROLLART_REWARD_TOKEN"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_CHARS = 8
USAGE_ERROR = 2  # what argparse and click exit with on a bad command line


@dataclass(frozen=True)
class ServeOptions:
    """`serve`'s options once checked: exactly what `serve_function` is called with."""

    spec: str
    name: str
    token: str
    host: str
    port: int
    workers: int
    cache_path: str


def serve_options(spec: str, name: str | None = None, host: str | None = None, port: int = 8000,
                  token_env: str = TOKEN_ENV, workers: int = 1, cache_path: str | None = None) -> ServeOptions:
    """Check every option before anything binds, so a mistake is one line naming the option and what
    it allows instead of a traceback from a uvicorn worker; the spec is imported once here for that."""
    # deps: load_reward
    # VAL: VAL_NON_EMPTY(token_env, name="--token-env", exc=RewardError)
    check.non_empty("--token-env", token_env, exc=RewardError)  # generated #12b968a1d7
    # VAL: VAL_INT_RANGE(port, min=0, max=65535, name="--port", exc=RewardError)
    check.int_range("--port", port, min=0, max=65535, exc=RewardError)  # generated #71125f0f58
    # VAL: VAL_INT_RANGE(workers, min=1, max=MAX_WORKERS, name="--workers", exc=RewardError)
    check.int_range("--workers", workers, min=1, max=MAX_WORKERS, exc=RewardError)  # generated #d987109b10
    token = os.environ.get(token_env, "")
    if len(token) < MIN_TOKEN_CHARS:  # the token itself never appears in a message
        raise RewardError(f"--token-env: set {token_env} to a bearer token of at least {MIN_TOKEN_CHARS} "
                          "characters (clients send it)")
    reward_name = name or spec.rpartition(":")[2]
    try:
        load_reward(spec, reward_name)
    except RewardError as err:
        raise RewardError(f"SPEC: {err}") from None
    cache = cache_path or str(Path(tempfile.mkdtemp(prefix="rollart-reward-")) / "cache.sqlite")
    return ServeOptions(spec=spec, name=reward_name, token=token, host=host or "127.0.0.1", port=port,
                        workers=workers, cache_path=cache)


def serve_command(spec: str, name: str | None = None, host: str | None = None, port: int = 8000,
                  token_env: str = TOKEN_ENV, workers: int = 1, cache_path: str | None = None) -> int:
    """The one body of `rollart-reward serve` and of its alias `rollart reward serve`, so both behave
    alike: 2 after one line on stderr for bad input, else serve until stopped and return 0."""
    # deps: serve_options, serve_function
    try:
        options = serve_options(spec, name=name, host=host, port=port, token_env=token_env, workers=workers,
                                cache_path=cache_path)
    except RewardError as err:
        print(err, file=sys.stderr)
        return USAGE_ERROR
    if options.host not in LOOPBACK_HOSTS:
        print(f"warning: binding {options.host}: the reward service is reachable from other machines", file=sys.stderr)
    print(f"serving reward {options.name!r} from {spec} on http://{options.host}:{options.port} (POST /v1/score)",
          file=sys.stderr, flush=True)
    made = Path(options.cache_path).parent if cache_path is None else None  # the temp dir serve_options made
    with removed_on_exit(made):
        serve_function(options.spec, options.name, options.token, host=options.host, port=options.port,
                       workers=options.workers, cache_path=options.cache_path)
    return 0


@contextlib.contextmanager
def removed_on_exit(directory: Path | None) -> Iterator[None]:
    """Remove `directory` when the body ends, however it ends, SIGTERM included (D31).

    Why a SIGTERM handler: uvicorn re-raises the SIGTERM it caught once it has stopped, and the
    default action ends the process before any `finally` runs; the handler removes the directory,
    then lets the signal end the process as before (same exit status).
    """
    if directory is None:
        yield
        return
    previous = None

    def on_term(signum: int, _frame: Any) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    """The `rollart-reward` command line; its `serve` options are the application alias's, one for one."""
    parser = argparse.ArgumentParser(prog="rollart-reward", description="rollart Reward-as-a-Service.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve one reward function over HTTP (a plain trajectory -> float works)",
        description="Serve one reward function over HTTP: POST /v1/score, GET /health, bearer-token auth.")
    serve.add_argument("spec", metavar="SPEC", help="the reward: package.module:function or path/to/file.py:function")
    serve.add_argument("--name", default=None, help="the reward's name at /v1/score (default: the function name)")
    serve.add_argument("--host", default=None,
                       help="bind address (default 127.0.0.1; anything else only when given here)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port")
    serve.add_argument("--token-env", default=TOKEN_ENV, help="environment variable holding the bearer token")
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    serve.add_argument("--cache-path", default=None, help="result cache (default: a fresh file in a temp dir)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`rollart-reward serve SPEC [--port 8000 ...]`; the exit code is returned so a test can call it in process."""
    # deps: build_parser, serve_command
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from importlib.metadata import version

        print(f"rollart-reward {version('rollart-reward')}")
        return 0
    if args.command != "serve":
        parser.print_usage(sys.stderr)
        print("rollart-reward: error: a COMMAND is required (choose from 'serve')", file=sys.stderr)
        return USAGE_ERROR
    return serve_command(args.spec, name=args.name, host=args.host, port=args.port, token_env=args.token_env,
                         workers=args.workers, cache_path=args.cache_path)


if __name__ == "__main__":
    raise SystemExit(main())
