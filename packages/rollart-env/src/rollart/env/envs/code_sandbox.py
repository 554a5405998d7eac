"""A code environment: the policy writes Python, the sandbox runs it against hidden tests.

Each test is an assert run in the same sandboxed process after the solution; the harness
prints one PASS/FAIL line per test, so the reward is the fraction of tests passed and the
observation tells the policy which failed (it may try again up to `max_attempts`).
"""

from __future__ import annotations

import json
import re
from importlib import resources

from rollart.env import checks as check
from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits
from rollart.env.errors import EnvError
from rollart.env.protocols import ResetResult, StepResult

SYSTEM_PROMPT = "Write the requested Python function in a ```python code block."
_CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_MARK = "__ROLLART_TEST__"


def extract_code(text: str) -> str | None:
    """The last fenced code block, else None."""
    blocks = _CODE_RE.findall(text)
    return blocks[-1] if blocks else None


def build_harness(code: str, tests: list[str]) -> str:
    """The solution followed by one guarded block per test printing a PASS/FAIL marker."""
    lines = [code, "", "def __rollart_run_tests():"]
    for i, test in enumerate(tests):
        lines += [
            "    try:",
            f"        exec({test!r}, globals())",
            f"        print('{_MARK} {i} PASS', flush=True)",
            "    except BaseException as e:",
            f"        print('{_MARK} {i} FAIL', type(e).__name__, flush=True)",
        ]
    lines += ["__rollart_run_tests()"]
    return "\n".join(lines)


def load_code_tasks() -> list[dict]:
    """The shipped tasks (`data/code_tasks.jsonl`)."""
    text = resources.files("rollart.env.envs").joinpath("data/code_tasks.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class CodeSandboxEnv:
    """Python coding tasks scored by sandboxed tests."""

    def __init__(self, limits: SandboxLimits | None = None, max_attempts: int = 2) -> None:
        """Load the shipped tasks; every run uses a fresh sandbox process under `limits`."""
        # VAL: VAL_INT_RANGE(max_attempts, min=1, max=100, exc=EnvError)
        check.int_range("max_attempts", max_attempts, min=1, max=100, exc=EnvError)  # generated #a45e7ff5a7
        self.name = "code_sandbox"
        self.system_prompt = SYSTEM_PROMPT
        self.sandbox = PythonSandbox(limits or SandboxLimits())
        self.max_attempts = max_attempts
        self._tasks = load_code_tasks()
        self._task: dict | None = None
        self._attempts = 0

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Pick the task for `seed`."""
        self._task = self._tasks[(seed or 0) % len(self._tasks)]
        self._attempts = 0
        return ResetResult(self._task["prompt"], {"num_tests": len(self._task["tests"])})

    async def step(self, action: str) -> StepResult:
        """Run the code block against the tests; reward = fraction passed."""
        # AST: AST_PRECONDITION(self._task is not None, got=self._task, msg="reset before step", exc=EnvError)
        check.precondition(self._task is not None, "reset before step", got=self._task, exc=EnvError)  # generated #b0c8eb163c
        self._attempts += 1
        out_of_attempts = self._attempts >= self.max_attempts
        code = extract_code(action)
        if code is None:
            return StepResult("No ```python code block found.", 0.0, False, out_of_attempts, {"success": False})
        tests = self._task["tests"]
        result = await self.sandbox.run(build_harness(code, tests))
        passed = sum(1 for line in result.stdout.splitlines() if line.startswith(_MARK) and line.endswith("PASS"))
        score = passed / len(tests)
        success = passed == len(tests)
        observation = f"{passed}/{len(tests)} tests passed (sandbox status: {result.status})."
        if result.status not in ("ok",) and result.stderr:
            observation += "\n" + result.stderr.strip().splitlines()[-1][:300]
        info = {"success": success, "sandbox_status": result.status, "passed": passed}
        return StepResult(observation, score, success, out_of_attempts and not success, info)

    async def close(self) -> None:
        """Nothing to release (each run's process and directory are already gone)."""
