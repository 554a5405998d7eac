"""The `rollart` command: `run`, `plan`, `sim`, `timeline`, `reward serve`, `--version`.

Why typer + rich: typed options with help for free, and a live line that shows what an operator
watches in an RL run (trajectories done, tokens/s, reward, weight version, what each GPU does).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollart import checks as check
from rollart.app.config import RunConfig
from rollart.app.overrides import load_config_with
from rollart.app.preflight import check_before_start
from rollart.app.run_logs import root_cause, run_logs
from rollart.scheduler.checkpoint import ConfigChangedError
from rollart.scheduler.errors import ConfigError, RunFailed, SchedulerError
from rollart.scheduler.timeline import plot_timeline

app = typer.Typer(add_completion=False, help="RollArt: agentic RL on disaggregated hardware.")
reward_app = typer.Typer(add_completion=False, help="Reward-as-a-Service.")
app.add_typer(reward_app, name="reward")
SET_HELP = "override a config field: dotted.key=value (YAML value; list items by index), repeatable"


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"rollart {version('rollart-app')}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version and exit"),
) -> None:
    """RollArt: agentic RL on disaggregated hardware."""


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

    from rollart.app.config import required_devices

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
                       resume: bool = True, base_dir: Path | None = None,
                       allow_config_change: bool = False) -> list[dict[str, Any]]:
    """Build, (resume,) run with the pipeline's progress line, draw the timeline; return the records."""
    from rollart.app.builder import build_pipeline

    console = console or Console()
    pipe = await build_pipeline(config, run_dir, base_dir=base_dir)
    records: list[dict[str, Any]] = []
    stop_signals = stop_on_signals(pipe)
    try:
        if resume and await pipe.restore(allow_config_change=allow_config_change):
            console.print(f"resumed from checkpoint at iteration {pipe.iteration} (version {pipe.parts.trainer.version})")
        await pipe.run(iterations, on_iteration=records.append, progress=console)
    finally:
        stop_signals()
        await pipe.close()
    if pipe.stop_reason is not None:  # SIGTERM / SIGINT: checkpointed and released, then the signal's exit code
        console.print(f"stopped by {pipe.stop_reason} after iteration {pipe.iteration}; resume with: "
                      f"rollart run CONFIG --run-dir {run_dir}")
        raise typer.Exit(code=128 + SIGNAL_NUMBERS.get(pipe.stop_reason, signal.SIGTERM))
    try:
        png = plot_timeline(run_dir, run_dir / "timeline.png")
        console.print(f"timeline: {png}")
    except SchedulerError as err:
        console.print(f"no timeline: {err}")
    console.print(f"metrics: {run_dir / 'metrics.jsonl'}")
    return records


SIGNAL_NUMBERS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def stop_on_signals(pipe: Any) -> Any:
    """SIGTERM and SIGINT ask the pipeline to stop cleanly (D52); returns the function that restores the defaults."""
    loop = asyncio.get_running_loop()
    for name, number in SIGNAL_NUMBERS.items():
        loop.add_signal_handler(number, pipe.request_stop, name)

    def restore() -> None:
        for number in SIGNAL_NUMBERS.values():
            loop.remove_signal_handler(number)

    return restore


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML run config"),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="default: runs/<name>-<timestamp>"),
    iterations: int | None = typer.Option(None, "--iterations", "-n", help="override run.iterations"),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
    allow_config_change: bool = typer.Option(False, "--allow-config-change",
                                             help="resume a run dir whose checkpoint was written under another config"),
) -> None:
    """`rollart run CONFIG`: build the pipeline from YAML and run it with a rich progress display."""
    try:
        cfg = load_config_with(config, sets)
        count = cfg.run.iterations if iterations is None else iterations
        # VAL: VAL_INT_RANGE(count, min=1, max=10_000_000, name="--iterations", exc=ConfigError)
        check.int_range("--iterations", count, min=1, max=10_000_000, exc=ConfigError)  # generated #0924402678
    except ConfigError as err:  # before anything starts: one line, exit 2
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    out = Path(run_dir) if run_dir else default_run_dir(cfg)
    existed = out.exists()
    logs = None
    try:
        check_before_start(cfg, base_dir=Path(config).resolve().parent)  # before Ray starts (app D57)
        init_ray(cfg)
        with run_logs(out) as logs:
            asyncio.run(run_pipeline(cfg, out, count, base_dir=Path(config).parent,
                                     allow_config_change=allow_config_change))
    except (ConfigError, ConfigChangedError) as err:  # found before a step ran: a name, a capacity, a resume
        if not existed:  # a run that never started leaves no run directory behind (app D58)
            shutil.rmtree(out, ignore_errors=True)
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    except typer.Exit:  # a stop by signal already chose its exit code (128 + the signal)
        raise
    except RunFailed as err:  # a part the run cannot go on without is gone: one line, what and how to resume
        cause = root_cause(err, logs.copied if logs is not None else [])
        why = f" (root cause: {cause.line}, in {cause.log})" if cause.log is not None else ""
        typer.echo(f"run failed: {err}{why}; logs: {out / 'logs'}", err=True)
        raise typer.Exit(code=1) from None
    except Exception as err:  # a part failed: its root cause in one line, and where the logs are (app D56)
        cause = root_cause(err, logs.copied if logs is not None else [])
        where = f" (in {cause.log})" if cause.log is not None else ""
        typer.echo(f"run failed: {cause.line}{where}; logs: {out / 'logs'}", err=True)
        raise typer.Exit(code=1) from None


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


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="a run directory written by `rollart run`"),
) -> None:
    """`rollart report RUN_DIR`: print a summary and write RUN_DIR/report.html with plots (app D58)."""
    from rollart.app.report import summarize, write_report

    try:
        page = write_report(run_dir)
    except SchedulerError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    for line in summarize(run_dir).lines():
        typer.echo(line)
    typer.echo(f"report: {page}")


checkpoint_app = typer.Typer(add_completion=False, help="Model checkpoints for the example configs.")
app.add_typer(checkpoint_app, name="checkpoint")


@checkpoint_app.command("init")
def checkpoint_init(
    path: Path = typer.Argument(..., help="the directory to write (created; an existing checkpoint is overwritten)"),
    seed: int = typer.Option(0, "--seed", help="the random init's seed (same seed, same weights)"),
) -> None:
    """`rollart checkpoint init DIR`: a tiny random-init Hugging Face checkpoint for the example configs."""
    from rollart.app.model_source import init_tiny_checkpoint

    try:
        written = init_tiny_checkpoint(str(path), seed=seed)
    except SchedulerError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    typer.echo(f"wrote a tiny checkpoint to {written} (use it with --set model.path={written})")


@app.command()
def plan(
    config: Path = typer.Argument(..., help="YAML run config"),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """`rollart plan CONFIG`: validate, resolve every name and print the placement and memory estimate; starts nothing."""
    from rollart.app.plan import render_plan
    from rollart.app.preflight import preflight

    try:
        cfg = load_config_with(config, sets)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    checked = preflight(cfg, base_dir=Path(config).resolve().parent)  # what `rollart run` checks (app D57)
    if checked.plan is not None:
        render_plan(checked.plan, Console(width=160))
    for problem in checked.problems:
        typer.echo(str(problem), err=True)
    if checked.problems:
        raise typer.Exit(code=2)


@app.command()
def sim(
    scenario: Path = typer.Argument(..., help="scenario YAML: a run config, a workload and the runs to compare"),
    as_json: bool = typer.Option(False, "--json", help="print the results as JSON instead of a table"),
    timeline_png: Path | None = typer.Option(None, "--timeline", help="write the device-role timeline of every run to this PNG"),
    only: list[str] = typer.Option([], "--run", help="run only these runs of the scenario (repeatable)"),
    seed: int | None = typer.Option(None, "--seed", min=0, help="run with this seed instead of the scenario's (repeat with others to see the spread)"),
    search: str | None = typer.Option(None, "--search", help="`static`: search the best feasible static layout under the budget (the scenario's `search:` section, or the options below)"),
    budget_devices: int | None = typer.Option(None, "--budget-devices", help="--search: trainer + rollout devices, at most"),
    budget_cost: float | None = typer.Option(None, "--budget-cost", help="--search: trainer + rollout cost per hour (H800 = 1.0), at most"),
    metric: str | None = typer.Option(None, "--metric", help="--search: step_time (shortest step) or trained_tokens_per_s"),
) -> None:
    """`rollart sim SCENARIO.yaml`: the real pipeline with simulated engines, trainer and sync, in virtual time."""
    import json

    from rollart.app.sim.runner import plot_roles, render, run_scenario
    from rollart.app.sim.scenario import load_scenario

    try:
        spec = load_scenario(scenario)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    if seed is not None:  # a result is deterministic per seed; its spread across seeds is what a reader compares
        spec = spec.model_copy(update={"seed": seed})
    if search is not None or budget_devices is not None or budget_cost is not None or metric is not None:
        _sim_search(spec, search, budget_devices, budget_cost, metric, as_json)
        return
    runs = [r for r in spec.runs if not only or r.name in only]
    console = Console(stderr=as_json)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}"), console=console, transient=as_json) as progress:
        task = progress.add_task(spec.name, total=len(runs) * spec.iterations, status="")

        def on_iteration(name: str, rec: dict[str, Any]) -> None:
            progress.update(task, advance=1, status=f"{name}: iteration {rec['iteration']} at {rec['t_end']:.0f} virtual s")

        results = run_scenario(spec, on_iteration, only=[r.name for r in runs])
    if as_json:
        typer.echo(json.dumps({"scenario": spec.name, "paper": spec.paper, "runs": [r.row() for r in results]}, indent=1))
    else:
        render(spec, results, console)
    if timeline_png is not None:
        path = plot_roles(results, timeline_png, title=spec.name)
        console.print(f"timeline: {path}")


def _sim_search(spec: Any, search: str | None, budget_devices: int | None, budget_cost: float | None,
                metric: str | None, as_json: bool) -> None:
    """`rollart sim --search static`: every candidate as it finishes, then the best feasible layout (app D67)."""
    import json

    from rollart.app.sim.search import search_spec, search_static

    try:
        options = search_spec(spec, search, budget_devices=budget_devices, budget_cost=budget_cost, metric=metric)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    console = Console(stderr=as_json)

    def on_candidate(c: Any) -> None:
        r = c.result
        what = (f"infeasible: {c.infeasible}" if c.infeasible else
                f"{r.iteration_s:.1f} s/step, {r.trained_tokens_per_s:,.0f} trained tok/s ({r.wall_s:.0f} s wall)")
        console.print(f"  {c.name} (cost {c.cost:.1f}): {what}")

    try:
        found = search_static(spec, options, on_candidate=on_candidate)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=2) from None
    if as_json:
        typer.echo(json.dumps({"scenario": spec.name, "search": found.row()}, indent=1))
    elif found.best is None:
        console.print("no feasible static layout under this budget")
    else:
        r = found.best.result
        console.print(f"best feasible static layout ({options.metric}): {found.best.name}: {r.iteration_s:.1f} s/step, "
                      f"{r.trained_tokens_per_s:,.0f} trained tok/s, cost {found.best.cost:.1f}")


@reward_app.command("serve")
def reward_serve(
    spec: str = typer.Argument(..., help="the reward: package.module:function or path/to/file.py:function"),
    name: str | None = typer.Option(None, "--name", help="the reward's name at /v1/score (default: the function name)"),
    host: str | None = typer.Option(None, "--host", help="bind address (default 127.0.0.1; anything else only when given here)"),
    port: int = typer.Option(8000, "--port", help="TCP port"),
    token_env: str = typer.Option("ROLLART_REWARD_TOKEN", "--token-env", help="environment variable holding the bearer token"),
    workers: int = typer.Option(1, "--workers", help="uvicorn worker processes"),
    cache_path: Path | None = typer.Option(None, "--cache-path", help="result cache (default: a fresh file in a temp dir)"),
) -> None:
    """`rollart reward serve module:function`: serve one reward function over HTTP (a plain trajectory -> float works).

    An alias of `rollart-reward serve` (rollart-reward's own command, its design D25): both call
    `serve_command`, so they check the same options and say the same things.
    """
    from rollart.reward.cli import serve_command

    code = serve_command(spec, name=name, host=host, port=port, token_env=token_env, workers=workers,
                         cache_path=None if cache_path is None else str(cache_path))
    if code:
        raise typer.Exit(code=code)


if __name__ == "__main__":  # pragma: no cover
    app()
