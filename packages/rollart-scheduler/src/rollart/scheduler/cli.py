"""The `rollart` command: `rollart run CONFIG` and `rollart timeline RUN_DIR -o timeline.png`.

Why typer + rich: typed options with help for free, and a live line that shows what an operator
watches in an RL run (trajectories done, tokens/s, reward, weight version, what each GPU does).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollart.scheduler.config import RunConfig, load_config
from rollart.scheduler.errors import ConfigError, SchedulerError
from rollart.scheduler.timeline import plot_timeline

app = typer.Typer(add_completion=False, help="RollArt: agentic RL on disaggregated hardware.")
ROLE_CHAR = {"rollout": "R", "train": "T", "idle": ".", "transfer": "~"}


def init_ray(config: RunConfig) -> bool:
    """Connect to Ray as `cluster.ray` says: none, a local cluster on 127.0.0.1, or an existing address.

    A local cluster gets one logical GPU per configured device and one custom resource per hardware
    type (`{"H800": 2, "H20": 2}`), so placement by hardware is real; an existing cluster is only
    joined (and left running when the run ends).
    """
    if not config.cluster.uses_ray:
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from rollart.scheduler.config import required_devices

    if ray.is_initialized():
        return True
    if config.cluster.is_local:
        inventory = dict(config.cluster.devices or required_devices(config))
        gpus = sum(n for hw, n in inventory.items() if hw != "CPU")
        ray.init(num_gpus=gpus, resources={hw: float(n) for hw, n in inventory.items() if hw != "CPU"},
                 _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    else:
        try:
            ray.init(address=config.cluster.ray, log_to_driver=False)
        except ConnectionError as err:
            cause = f": {err.__cause__}" if err.__cause__ else ""
            hint = ("; the cluster uses token authentication: set RAY_AUTH_MODE=token (the token comes from "
                    "RAY_AUTH_TOKEN or ~/.ray/auth_token)") if "auth" in str(err.__cause__).lower() else ""
            raise ConfigError(f"cluster.ray: cannot connect to {config.cluster.ray!r}{cause.splitlines()[0] if cause else ''}"
                              f"{hint}") from None
    return True


def default_run_dir(config: RunConfig) -> Path:
    """`runs/<name>-<timestamp>` unless the config names one."""
    if config.run.run_dir:
        return Path(config.run.run_dir)
    return Path("runs") / f"{config.run.name}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


async def run_pipeline(config: RunConfig, run_dir: Path, iterations: int, console: Console | None = None,
                       resume: bool = True, base_dir: Path | None = None) -> list[dict[str, Any]]:
    """Build, (resume,) run with a live progress line, draw the timeline; return the records."""
    from rollart.scheduler.builder import build_pipeline

    console = console or Console()
    pipe = await build_pipeline(config, run_dir, base_dir=base_dir)
    records: list[dict[str, Any]] = []
    try:
        if resume and await pipe.restore():
            console.print(f"resumed from checkpoint at iteration {pipe.iteration} (version {pipe.parts.trainer.version})")
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), console=console, transient=False) as progress:
            task = progress.add_task(f"{config.run.name} [{config.pipeline.mode}]", total=iterations,
                                     completed=pipe.iteration, status="")
            last: dict[str, Any] = {}

            def status() -> str:
                done = sum(1 for r in pipe.parts.buffer.records().values() if r.state == "consumed")
                roles = pipe.parts.timeline.roles() if pipe.parts.timeline else {}
                gpus = "".join(ROLE_CHAR.get(roles[d], "?") for d in sorted(roles))
                return (f"traj {done}  tok/s {last.get('tokens_per_s', 0):.0f}  reward {last.get('reward_mean', 0):.2f}  "
                        f"v{pipe.parts.trainer.version}  GPUs [{gpus}]")

            async def refresh() -> None:
                while True:
                    progress.update(task, status=status())
                    await asyncio.sleep(0.5)

            def on_iteration(rec: dict[str, Any]) -> None:
                last.update(rec)
                records.append(rec)
                progress.update(task, completed=rec["iteration"], status=status())

            ticker = asyncio.create_task(refresh())
            try:
                await pipe.run(iterations, on_iteration=on_iteration)
            finally:
                ticker.cancel()
    finally:
        await pipe.close()
    try:
        png = plot_timeline(run_dir, run_dir / "timeline.png")
        console.print(f"timeline: {png}")
    except SchedulerError as err:
        console.print(f"no timeline: {err}")
    console.print(f"metrics: {run_dir / 'metrics.jsonl'}")
    return records


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML run config"),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="default: runs/<name>-<timestamp>"),
    iterations: int | None = typer.Option(None, "--iterations", "-n", help="override run.iterations"),
) -> None:
    """`rollart run CONFIG`: build the pipeline from YAML and run it with a rich progress display."""
    try:
        cfg = load_config(config)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    out = Path(run_dir) if run_dir else default_run_dir(cfg)
    try:
        init_ray(cfg)
        asyncio.run(run_pipeline(cfg, out, iterations or cfg.run.iterations, base_dir=Path(config).parent))
    except ConfigError as err:  # a name or a capacity problem found before anything started
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None


@app.command()
def timeline(
    run_dir: Path = typer.Argument(..., help="a run directory written by `rollart run`"),
    out: Path = typer.Option(Path("timeline.png"), "-o", "--out", help="the PNG to write"),
) -> None:
    """`rollart timeline RUN_DIR -o timeline.png`."""
    try:
        path = plot_timeline(run_dir, out)
    except SchedulerError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    typer.echo(str(path))


if __name__ == "__main__":  # pragma: no cover
    app()
