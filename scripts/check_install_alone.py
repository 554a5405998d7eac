"""Run each package README's install commands as written in an empty venv, then its Python snippets.

    python scripts/check_install_alone.py [rollart-env ...] [--no-wheelhouse]

What the docs claim is what is tested: the `pip install ...` lines of `packages/<name>/README.md`
run verbatim from the repository root (so `packages/rollart-x` paths resolve) with the venv's pip
first on PATH, and no `--find-links` to sibling wheels is added. Lines that install a GPU-only or
heavy extra (`[vllm]`, `[megatron]`, `[mooncake]`) are reported and skipped. Then `import rollart.<x>`
and every README Python snippet (except those marked `# not run: <reason>`) run in that venv.
Finally the documented wheelhouse route (`make wheels`, then `pip install --find-links wheelhouse
rollart-reward`, the package with the most siblings below the scheduler) runs in one more venv.
Third-party packages come from the machine's normal package index configuration.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_snippets import HEAVY_EXTRAS, PACKAGES, install_commands, runnable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE_PACKAGE = "rollart-reward"


def run(cmd: list[str] | str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def make_venv(path: Path) -> tuple[Path, dict[str, str]]:
    """An empty venv (no system site-packages) and an environment with its bin/ first on PATH."""
    res = run([sys.executable, "-m", "venv", str(path)])
    if res.returncode != 0:
        raise RuntimeError(f"venv failed: {res.stderr}")
    env = {**os.environ, "PATH": f"{path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(path),
           # what gets installed is unchanged; skipping .pyc compilation of torch & co. saves minutes per venv
           "PIP_NO_COMPILE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # the dev wrapper's source paths must not leak into the empty venv
    return path / "bin" / "python", env


def check_imports_and_snippets(package: str, py: Path, env: dict[str, str], workdir: Path) -> tuple[bool, str]:
    module = "rollart." + package.removeprefix("rollart-")
    res = run([str(py), "-c", f"import {module}; print({module}.__version__)"], cwd=workdir, env=env)
    if res.returncode != 0:
        return False, f"import {module} failed:\n{res.stderr[-3000:]}"
    ran = 0
    for snip in runnable(package):
        res = run([str(py), "-c", snip.code], cwd=workdir, env=env, timeout=600)
        if res.returncode != 0:
            return False, f"README.md:{snip.line} snippet failed:\n{res.stderr[-3000:]}"
        ran += 1
    return True, f"import ok, {ran} snippet(s) ok"


def install_as_documented(package: str, workdir: Path) -> tuple[bool, str, float]:
    """Run the README's install lines in an empty venv, then the import and the snippets."""
    start = time.monotonic()
    py, env = make_venv(workdir / package)
    skipped = []
    for cmd in install_commands(package):
        if any(extra in cmd for extra in HEAVY_EXTRAS):
            skipped.append(cmd)
            continue
        res = run(["bash", "-c", cmd.replace("pip install", "pip install -q", 1)], cwd=ROOT, env=env)
        if res.returncode != 0:
            return False, f"`{cmd}` failed:\n{res.stderr[-3000:]}", time.monotonic() - start
    ok, detail = check_imports_and_snippets(package, py, env, workdir)
    if skipped:
        detail += f"; not run (heavy extras): {skipped}"
    return ok, detail, time.monotonic() - start


def install_from_wheelhouse(package: str, workdir: Path) -> tuple[bool, str, float]:
    """`make wheels` + `pip install --find-links wheelhouse <package>`, as getting-started documents."""
    start = time.monotonic()
    wheelhouse = workdir / "wheelhouse"
    res = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheelhouse),
               *[str(ROOT / "packages" / p) for p in PACKAGES]])
    if res.returncode != 0:
        return False, f"building the wheelhouse failed:\n{res.stderr[-3000:]}", time.monotonic() - start
    py, env = make_venv(workdir / f"{package}-wheelhouse")
    res = run(["pip", "install", "-q", "--find-links", str(wheelhouse), package], cwd=workdir, env=env)
    if res.returncode != 0:
        return False, f"pip install --find-links wheelhouse {package} failed:\n{res.stderr[-3000:]}", time.monotonic() - start
    ok, detail = check_imports_and_snippets(package, py, env, workdir)
    return ok, detail, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    parser.add_argument("--no-wheelhouse", action="store_true", help="skip the wheelhouse route")
    args = parser.parse_args(argv)
    failed = []
    with tempfile.TemporaryDirectory(prefix="rollart-alone-") as tmp:
        checks = [(p, "readme", install_as_documented) for p in args.packages]
        if not args.no_wheelhouse:
            checks.append((WHEELHOUSE_PACKAGE, "wheelhouse", install_from_wheelhouse))
        # the checks are independent venvs, mostly waiting on unpacking and the network: run a few at once
        jobs = int(os.environ.get("ROLLART_INSTALL_JOBS", "3"))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [(package, route, pool.submit(check, package, Path(tmp))) for package, route, check in checks]
            for package, route, future in futures:
                ok, detail, secs = future.result()
                print(f"{package:20s} {route:10s} {'ok' if ok else 'FAILED':6s} {secs:6.1f} s  {detail if ok else ''}",
                      flush=True)
                if not ok:
                    failed.append(f"{package} ({route})")
                    print(detail, file=sys.stderr)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
