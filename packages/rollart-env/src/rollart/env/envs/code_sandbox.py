"""A code environment: the policy writes Python, the sandbox runs it, the verdict is computed outside.

Why the verdict is not read from the program's output: the program under test shares its process
(and its stdout) with whatever runs the tests, so any "PASS" line it could print is a line the
program can print itself — a policy learns to print it. Here the sandbox only evaluates each test's
*expression* (e.g. `add(1, 2)`) and reports `repr` of the value; the expected values never enter
the sandbox, and the harness's parent compares them after the run (`grade_results`). A program can
forge records, but a forged record passes only if it carries the right value, i.e. only by solving
the task. Each test is scored at most once, so the score is in [0, 1] whatever is printed.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rollart import checks as check
from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits
from rollart.env.errors import EnvError
from rollart.env.protocols import ResetResult, StepResult

SYSTEM_PROMPT = "Write the requested Python function in a ```python code block."
_CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
MAX_REPR_CHARS = 10_000


@dataclass(frozen=True)
class CodeTest:
    """One hidden test: an expression evaluated in the sandbox and the value it must equal.

    `expected` stays in the parent process: it is never written into the sandboxed program.
    """

    expression: str
    expected: Any


def parse_test(test: str) -> CodeTest:
    """`assert E == L` -> (E, L) with L a literal; `assert E` -> (`bool(E)`, True); `assert not E` -> (`bool(E)`, False)."""
    try:
        tree = ast.parse(test.strip())
    except SyntaxError as exc:
        raise EnvError(f"test must be one assert statement, got {test!r}") from exc
    stmt = tree.body[0] if len(tree.body) == 1 else None
    # AST: AST_PRECONDITION(isinstance(stmt, ast.Assert), got=test, msg="a test is one assert statement", exc=EnvError)
    check.precondition(isinstance(stmt, ast.Assert), "a test is one assert statement", got=test, exc=EnvError)  # generated #e456e972ba
    node = stmt.test
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
        try:
            expected = ast.literal_eval(node.comparators[0])
        except ValueError as exc:
            raise EnvError(f"the right side of == must be a literal, got {test!r}") from exc
        return CodeTest(ast.unparse(node.left), expected)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return CodeTest(f"bool({ast.unparse(node.operand)})", False)
    return CodeTest(f"bool({ast.unparse(node)})", True)


def extract_code(text: str) -> str | None:
    """The last fenced code block, else None."""
    blocks = _CODE_RE.findall(text)
    return blocks[-1] if blocks else None


def build_harness(code: str, tests: list[CodeTest], nonce: str) -> str:
    """The solution, then one JSON record per test: `[nonce, i, "value", repr(v)]` or `[nonce, i, "raised", type]`.

    Only the expressions go in; the nonce just keeps the harness's records apart from ordinary prints
    (it is no secret from the program, and nothing depends on it being one).
    """
    expressions = [t.expression for t in tests]
    return "\n".join([
        code,
        "",
        "def __rollart_run_tests(__exprs, __nonce):",
        "    import json as __json",
        "    for __i, __e in enumerate(__exprs):",
        "        try:",
        "            __r = repr(eval(__e, globals()))",
        "            __rec = [__nonce, __i, 'value', __r]",
        "        except BaseException as __exc:",
        "            __rec = [__nonce, __i, 'raised', type(__exc).__name__]",
        "        print(__json.dumps(__rec), flush=True)",
        f"__rollart_run_tests({expressions!r}, {nonce!r})",
    ])  # fmt: skip


def grade_results(stdout: str, nonce: str, tests: list[CodeTest]) -> list[bool]:
    """One verdict per test, decided here (outside the sandbox) from the reported values.

    Test i passes iff exactly one record for i exists and its value, read back with
    `ast.literal_eval` (plain data only), equals the expected value. Duplicate records for a test
    fail it (the program printed its own), unreadable or oversized values fail it. Total on any text.
    """
    records: dict[int, list[Any]] = {}
    for line in stdout.splitlines():
        if nonce not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, list) and len(rec) == 4 and rec[0] == nonce and type(rec[1]) is int:
            records.setdefault(rec[1], []).append(rec)
    verdicts = []
    for i, test in enumerate(tests):
        recs = records.get(i, [])
        ok = False
        if len(recs) == 1 and recs[0][2] == "value" and isinstance(recs[0][3], str) and len(recs[0][3]) <= MAX_REPR_CHARS:
            try:
                ok = bool(ast.literal_eval(recs[0][3]) == test.expected)
            except Exception:  # literal_eval of hostile text: ValueError, SyntaxError, RecursionError, MemoryError...
                ok = False
        verdicts.append(ok)
    return verdicts


def load_code_tasks() -> list[dict]:
    """The shipped tasks (`data/code_tasks.jsonl`)."""
    text = resources.files("rollart.env.envs").joinpath("data/code_tasks.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class CodeSandboxEnv:
    """Python coding tasks scored by sandboxed tests, graded outside the sandbox.

    Reward: the improvement of the best fraction of tests passed so far, so each step's reward and
    the episode's return both stay in [0, 1] (a policy cannot earn more by failing partly several
    times than by passing once).
    """

    def __init__(self, limits: SandboxLimits | None = None, max_attempts: int = 2) -> None:
        """Load the shipped tasks; every run uses a fresh sandbox process under `limits`."""
        # VAL: VAL_INT_RANGE(max_attempts, min=1, max=100, exc=EnvError)
        check.int_range("max_attempts", max_attempts, min=1, max=100, exc=EnvError)  # generated #a45e7ff5a7
        self.name = "code_sandbox"
        self.system_prompt = SYSTEM_PROMPT
        self.sandbox = PythonSandbox(limits or SandboxLimits())
        self.max_attempts = max_attempts
        self._tasks = load_code_tasks()
        self._tests: list[list[CodeTest]] = [[parse_test(t) for t in task["tests"]] for task in self._tasks]
        self._task: dict | None = None
        self._task_tests: list[CodeTest] = []
        self._attempts = 0
        self._best = 0.0

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Pick the task for `seed`."""
        index = (seed or 0) % len(self._tasks)
        self._task, self._task_tests = self._tasks[index], self._tests[index]
        self._attempts = 0
        self._best = 0.0
        return ResetResult(self._task["prompt"], {"num_tests": len(self._task_tests)})

    async def step(self, action: str) -> StepResult:
        """Run the code block's test expressions in the sandbox; grade them here; reward = improvement."""
        # deps: extract_code, build_harness, PythonSandbox.run, grade_results
        # AST: AST_PRECONDITION(self._task is not None, got=self._task, msg="reset before step", exc=EnvError)
        check.precondition(self._task is not None, "reset before step", got=self._task, exc=EnvError)  # generated #b0c8eb163c
        self._attempts += 1
        out_of_attempts = self._attempts >= self.max_attempts
        code = extract_code(action)
        if code is None:
            return StepResult("No ```python code block found.", 0.0, False, out_of_attempts, {"success": False})
        tests = self._task_tests
        nonce = secrets.token_hex(8)
        result = await self.sandbox.run(build_harness(code, tests, nonce))
        verdicts = grade_results(result.stdout, nonce, tests)
        passed = sum(verdicts)
        score = passed / len(tests)
        reward = max(0.0, score - self._best)
        self._best = max(self._best, score)
        # AST: AST_POSTCONDITION(0.0 <= reward <= 1.0 and 0.0 <= self._best <= 1.0, got=(reward, self._best), msg="code rewards stay in [0, 1]", exc=EnvError)
        check.postcondition(0.0 <= reward <= 1.0 and 0.0 <= self._best <= 1.0, "code rewards stay in [0, 1]", got=(reward, self._best), exc=EnvError)  # generated #0f1a456729
        success = passed == len(tests)
        observation = f"{passed}/{len(tests)} tests passed (sandbox status: {result.status})."
        if result.status not in ("ok",) and result.stderr:
            observation += "\n" + result.stderr.strip().splitlines()[-1][:300]
        info = {"success": success, "sandbox_status": result.status, "passed": passed, "containment": result.containment}
        return StepResult(observation, reward, success, out_of_attempts and not success, info)

    async def close(self) -> None:
        """Nothing to release (each run's process and directory are already gone)."""
