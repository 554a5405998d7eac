"""Every error reaches the user: the run's logs in RUN_DIR/logs and one root-cause line when a part fails.

Why (issue 21, item 4): Ray runs with `log_to_driver=False` (the actors' output would interleave with
the progress line), so an actor that died left only `ActorDiedError` on the console and its cause
(an unsupported head size, an import error) in a file under /tmp/ray. Here the driver's own log
goes to RUN_DIR/logs/driver.log, the actors' output files of the local Ray session are copied to
RUN_DIR/logs/ when the run ends (however it ends), and `root_cause` finds the first exception a dead
actor printed, so the CLI can say in one line what happened and where the whole log is.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

LOGS_DIR = "logs"
DRIVER_LOG = "driver.log"
ACTOR_DEATHS = frozenset({"ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerDiedError",
                          "WorkerCrashedError"})
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")


@dataclass(frozen=True)
class RootCause:
    """The first exception line of a failure and the file it was found in (None: the driver's own exception)."""

    line: str
    log: Path | None


def attach_driver_log(run_dir: Path, level: int = logging.INFO) -> logging.Handler:
    """Send the `rollart` loggers (INFO and up) to RUN_DIR/logs/driver.log; WARNING and up still reach stderr.

    Returns the handler so the caller removes it when the run ends (no global state outlives a run).
    """
    logs = Path(run_dir) / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(logs / DRIVER_LOG, delay=True)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("rollart")
    logger.addHandler(handler)
    handler.rollart_level = logger.level  # type: ignore[attr-defined] - restored by detach_driver_log
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in logger.handlers):
        stderr = logging.StreamHandler()
        stderr.setLevel(logging.WARNING)
        stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(stderr)
        handler.rollart_stderr = stderr  # type: ignore[attr-defined] - removed with the file handler
    return handler


def detach_driver_log(handler: logging.Handler) -> None:
    """Undo `attach_driver_log` (the file is closed)."""
    logger = logging.getLogger("rollart")
    logger.removeHandler(handler)
    stderr = getattr(handler, "rollart_stderr", None)
    if stderr is not None:
        logger.removeHandler(stderr)
    logger.setLevel(getattr(handler, "rollart_level", logger.level))
    handler.close()


def ray_logs_dir() -> Path | None:
    """The local Ray session's log directory (None without Ray, or when this process did not start a node)."""
    try:
        import ray
        from ray._private import worker as ray_worker  # the session's node: no public accessor exists

        if not ray.is_initialized() or ray_worker._global_node is None:
            return None
        return Path(ray_worker._global_node.get_logs_dir_path())
    except Exception:  # noqa: BLE001 - no Ray, or an API that moved: the run has no actor logs to copy
        return None


def collect_actor_logs(run_dir: Path, source: Path | None = None) -> list[Path]:
    """Copy the non-empty worker output files (`worker-*.out`, `worker-*.err`) of `source` to RUN_DIR/logs/.

    `source` defaults to the local Ray session's log directory; returns the copies, oldest first.
    """
    # deps: ray_logs_dir
    source = source if source is not None else ray_logs_dir()
    if source is None or not source.is_dir():
        return []
    logs = Path(run_dir) / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    out = []
    for path in sorted(source.glob("worker-*"), key=lambda p: p.stat().st_mtime):
        if path.suffix in (".out", ".err") and path.stat().st_size > 0:
            out.append(Path(shutil.copy2(path, logs / path.name)))
    return out


def first_exception(text: str) -> str | None:
    """The exception line that ends the first traceback in `text` (`ValueError: head size 72 is not supported`).

    A traceback starts at `Traceback (most recent call last):` or at a frame line (`  File "..."`; Ray
    writes a creation task's traceback without the header); it ends at the first unindented line
    that names an exception.
    """
    in_trace = False
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last):") or line.lstrip().startswith('File "'):
            in_trace = True
            continue
        if in_trace and line and not line[0].isspace() and _EXCEPTION_LINE.match(line.strip()):
            return line.strip()
    return None


def root_cause(err: BaseException, logs: list[Path]) -> RootCause:
    """The line to print for a failed run: a dead actor's first exception (its own log first), else the innermost cause."""
    # deps: first_exception
    chain = _chain(err)
    if {type(e).__name__ for e in chain} & ACTOR_DEATHS:
        pids = set(re.findall(r"\bpid[=:]\s*(\d+)", " ".join(str(e) for e in chain)))
        ordered = sorted((p for p in logs if p.suffix == ".err"), key=lambda p: p.stem.rsplit("-", 1)[-1] not in pids)
        for path in ordered:
            line = first_exception(path.read_text(errors="replace"))
            if line is not None:
                return RootCause(line, path)
    inner = chain[-1]
    message = str(inner).strip().splitlines()
    return RootCause(f"{type(inner).__name__}: {message[0] if message else ''}".rstrip(": "), None)


@dataclass
class RunLogs:
    """What `run_logs` gathered: the driver log and the actor logs copied when the run ended."""

    directory: Path
    copied: list[Path] = field(default_factory=list)


@contextlib.contextmanager
def run_logs(run_dir: Path) -> Iterator[RunLogs]:
    """The driver log in RUN_DIR/logs for the body; the actors' logs copied there when it ends; a failure's traceback logged.

    A failure's traceback goes to driver.log only (the CLI prints one line, `root_cause`).
    """
    # deps: attach_driver_log, collect_actor_logs, detach_driver_log
    out = RunLogs(Path(run_dir) / LOGS_DIR)
    handler = attach_driver_log(run_dir)
    try:
        yield out
    except Exception as err:  # the whole traceback goes to the file only; the CLI prints one line
        if type(err).__name__ == "Exit":  # a chosen exit code (click/typer), not a failure
            raise
        handler.handle(logging.LogRecord("rollart.app", logging.ERROR, __file__, 0, "the run failed", None,
                                         sys.exc_info()))
        raise
    finally:
        detach_driver_log(handler)
        out.copied = collect_actor_logs(run_dir)


def _chain(err: BaseException) -> list[BaseException]:
    out, seen = [err], {id(err)}
    while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and id(nxt) not in seen:
        out.append(nxt)
        seen.add(id(nxt))
    return out
