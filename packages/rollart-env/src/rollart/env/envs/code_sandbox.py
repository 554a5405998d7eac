"""A code environment: the policy writes Python, the sandbox runs it, the verdict is computed outside.

Why the verdict is not read from the program's output: the program under test shares its process
(and its stdout) with whatever runs the tests, so any "PASS" line it could print is a line the
program can print itself — a policy learns to print it. Here the sandbox only evaluates each test's
*calls* (e.g. `add(1, 2)`) and reports their results as tagged plain data; the comparisons,
tolerances, literals and expected values never enter the sandbox: the harness's parent evaluates
every test's check itself after the run (`grade_results`, design D14 and D25). A program can forge
records, but a forged record passes only if it carries the right plain value, i.e. only by solving
the task. Each test is scored at most once, so the score is in [0, 1] whatever is printed.
"""

from __future__ import annotations

import ast
import builtins
import json
import logging
import operator
import re
import secrets
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from rollart import checks as check
from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits
from rollart.env.errors import EnvError
from rollart.env.protocols import ResetResult, StepResult

log = logging.getLogger(__name__)
SYSTEM_PROMPT = "Write the requested Python function in a ```python code block."
_CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class CodeTest:
    """One hidden test: the calls the sandbox evaluates (`probes`) and the check graded outside.

    `check` is the assert's expression with each probe replaced by the name `__probe_<j>`; it is
    evaluated in the parent (`evaluate_check`) over the probes' returned plain values. Literals,
    comparisons and expected values stay in the parent: they are never written into the program.
    """

    source: str
    check: ast.expr = field(compare=False, repr=False)
    probes: tuple[str, ...] = ()


# Evaluated here, on plain values: the program can neither define nor patch them.
_OUTSIDE_FUNCS = frozenset({"abs", "round", "len", "sorted", "sum", "min", "max", "all", "any", "bool", "list", "tuple", "set"})
_NUMBER_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_CMP_OPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}  # fmt: skip
# Inside a probe, nothing may look at a program value and answer a question about it.
_PROBE_FORBIDDEN = (
    ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
    ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.JoinedStr, ast.FormattedValue, ast.Starred,
)  # fmt: skip
MAX_RECORD_CHARS = 100_000
MAX_DEPTH = 64


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _probe_problem(node: ast.expr) -> str | None:
    """Why `node` cannot be evaluated in the sandbox as a probe, or None when it can.

    A probe is the program's own code applied to literals, names and other probes (`f(g(1), x)`,
    `Solution().solve([1, 2])`, `CONST`): whatever it returns is encoded strictly and judged here.
    A comparison, boolean operator, conditional or comprehension inside it would ask a program
    object a question in the program's process, so it is refused; so is an outside-only function
    (`len`, `abs`, ...) applied to a program value, which the program could answer for itself.
    """
    for sub in ast.walk(node):
        if isinstance(sub, _PROBE_FORBIDDEN):
            return f"{type(sub).__name__} inside the call {ast.unparse(node)!r} would run in the program's process"
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in _OUTSIDE_FUNCS:
            return f"{sub.func.id}() inside the call {ast.unparse(node)!r} would run in the program's process"
        if isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not):
            return f"'not' inside the call {ast.unparse(node)!r} would run in the program's process"
    return None


class _Parser:
    """Splits an assert's expression into the outside check and the probes (see `parse_test`)."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.probes: list[str] = []

    def fail(self, why: str) -> EnvError:
        return EnvError(f"test {self.test!r} cannot be graded outside the sandbox: {why}")

    def probe(self, node: ast.expr) -> ast.expr:
        problem = _probe_problem(node)
        if problem is not None:
            raise self.fail(problem)
        source = ast.unparse(node)
        if source not in self.probes:
            self.probes.append(source)
        return ast.Name(id=f"__probe_{self.probes.index(source)}", ctx=ast.Load())

    def outside(self, node: ast.expr) -> ast.expr:  # noqa: PLR0911 - one branch per node kind
        if _is_literal(node):
            return ast.Constant(value=ast.literal_eval(node))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return type(node)(elts=[self.outside(e) for e in node.elts], ctx=ast.Load())
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise self.fail("a ** in a dict display")
            return ast.Dict(keys=[self.outside(k) for k in node.keys], values=[self.outside(v) for v in node.values])
        if isinstance(node, ast.Compare):
            return ast.Compare(left=self.outside(node.left), ops=node.ops, comparators=[self.outside(c) for c in node.comparators])
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(op=node.op, values=[self.outside(v) for v in node.values])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            return ast.UnaryOp(op=node.op, operand=self.outside(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _NUMBER_OPS:
            return ast.BinOp(left=self.outside(node.left), op=node.op, right=self.outside(node.right))
        if isinstance(node, ast.Subscript):
            return ast.Subscript(value=self.outside(node.value), slice=self.outside(node.slice), ctx=ast.Load())
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.outside(p) for p in (node.lower, node.upper, node.step)]
            return ast.Slice(*parts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _OUTSIDE_FUNCS:
            if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                raise self.fail(f"{node.func.id}() takes positional arguments only here")
            return ast.Call(func=node.func, args=[self.outside(a) for a in node.args], keywords=[])
        if isinstance(node, (ast.Call, ast.Name, ast.Attribute)):
            return self.probe(node)
        raise self.fail(f"{type(node).__name__} is not a comparison, boolean operator, arithmetic or call")


def parse_test(test: str) -> CodeTest:
    """`assert <expr>` -> the outside check over the probes (the program calls) it needs.

    Parsed once, when the env loads its tasks: a shape that cannot be graded outside the sandbox
    (a comparison inside a generator, a lambda, ...) is refused here with the test's text, instead
    of being run in the program's process where the program could answer it.
    """
    try:
        tree = ast.parse(test.strip())
    except SyntaxError as exc:
        raise EnvError(f"test {test!r} must be one assert statement") from exc
    stmt = tree.body[0] if len(tree.body) == 1 else None
    # AST: AST_PRECONDITION(isinstance(stmt, ast.Assert), got=test, msg="a test is one assert statement", exc=EnvError)
    check.precondition(isinstance(stmt, ast.Assert), "a test is one assert statement", got=test, exc=EnvError)  # generated #e456e972ba
    parser = _Parser(test)
    outside = parser.outside(stmt.test)
    return CodeTest(test, ast.fix_missing_locations(ast.Expression(outside)).body, tuple(parser.probes))


class _ProbeFailed(Exception):
    """A probe the check needs raised, returned non-plain data or was reported more than once."""


def decode_plain(tagged: Any, depth: int = 0) -> Any:
    """The plain value a harness record encodes (`["int", "6"]`, `["list", [...]]`, ...).

    Only None, bool, int, float, str and list/tuple/set/frozenset/dict of them come back: whatever
    the program printed, nothing here is an object whose methods it wrote.
    """
    if depth > MAX_DEPTH or not isinstance(tagged, list) or not tagged or not isinstance(tagged[0], str):
        raise ValueError("not a tagged plain value")
    tag, rest = tagged[0], tagged[1:]
    if tag == "none" and not rest:
        return None
    if len(rest) != 1:
        raise ValueError("a tagged value has one payload")
    payload = rest[0]
    if tag == "bool" and type(payload) is bool:
        return payload
    if tag == "int" and type(payload) is str:
        return int(payload)
    if tag == "float" and type(payload) is str:
        return float.fromhex(payload)
    if tag == "str" and type(payload) is str:
        return payload
    if tag in ("list", "tuple", "set", "frozenset") and type(payload) is list:
        items = [decode_plain(x, depth + 1) for x in payload]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and type(payload) is list:
        pairs = []
        for pair in payload:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("a dict item is a pair")
            pairs.append((decode_plain(pair[0], depth + 1), decode_plain(pair[1], depth + 1)))
        return dict(pairs)
    raise ValueError(f"unknown tag {tag!r}")


def _number(value: Any) -> Any:
    if type(value) not in (int, float, bool):
        raise TypeError("arithmetic is on numbers only")
    return value


def _arith(op: ast.operator, left: Any, right: Any) -> Any:
    left, right = _number(left), _number(right)
    if isinstance(op, ast.Pow) and type(right) is int and abs(right) > 64 and abs(left) > 1:
        raise OverflowError("exponent too large")
    return _NUMBER_OPS[type(op)](left, right)


def evaluate_check(node: ast.expr, values: dict[str, Any]) -> Any:  # noqa: PLR0911, PLR0912 - one branch per node kind
    """Evaluate a check (see `parse_test`) here over plain values; Python's semantics, short-circuits kept.

    `values` maps `__probe_<j>` to a plain value or to a `_ProbeFailed` (a probe that raised): it
    fails the test only if the check needs it, as the assert would have. Arithmetic is on numbers
    only and powers are bounded, so a returned value cannot make the grader allocate without bound.
    """
    ev = evaluate_check
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = values[node.id]
        if isinstance(value, _ProbeFailed):
            raise value
        return value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](ev(e, values) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {ev(k, values): ev(v, values) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.BoolOp):
        result = None
        for v in node.values:
            result = ev(v, values)
            if bool(result) == isinstance(node.op, ast.Or):
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        operand = ev(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not operand
        return -_number(operand) if isinstance(node.op, ast.USub) else +_number(operand)
    if isinstance(node, ast.BinOp):
        return _arith(node.op, ev(node.left, values), ev(node.right, values))
    if isinstance(node, ast.Compare):
        left = ev(node.left, values)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = ev(comparator, values)
            if not _CMP_OPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript):
        return ev(node.value, values)[ev(node.slice, values)]
    if isinstance(node, ast.Slice):
        return slice(*(None if p is None else ev(p, values) for p in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _OUTSIDE_FUNCS:
        args = [ev(a, values) for a in node.args]
        if node.func.id in ("abs", "round"):
            _number(args[0])
        return getattr(builtins, node.func.id)(*args)
    raise TypeError(f"not a check node: {type(node).__name__}")


def extract_code(text: str) -> str | None:
    """The last fenced code block, else None."""
    blocks = _CODE_RE.findall(text)
    return blocks[-1] if blocks else None


_ENCODER = r'''
def __rollart_plain(__v, __depth=0, __type=type, __list=list):
    # plain data only, by exact type: a subclass of int/float/str/list/dict is not plain
    __t = __type(__v)
    if __depth > MAX_DEPTH:
        raise ValueError("nested too deep")
    if __v is None:
        return ["none"]
    if __t is bool:
        return ["bool", __v]
    if __t is int:
        return ["int", int.__repr__(__v)]
    if __t is float:
        return ["float", float.hex(__v)]
    if __t is str:
        return ["str", str.__str__(__v)]
    if __t in (list, tuple, set, frozenset):
        return [__t.__name__, [__rollart_plain(__x, __depth + 1) for __x in __list(__t.__iter__(__v))]]
    if __t is dict:
        return ["dict", [[__rollart_plain(__k, __depth + 1), __rollart_plain(__x, __depth + 1)] for __k, __x in dict.items(__v)]]
    raise TypeError("not plain data: " + __t.__name__)
'''.replace("MAX_DEPTH", str(MAX_DEPTH))


def build_harness(code: str, tests: list[CodeTest], nonce: str) -> str:
    """The solution, then one JSON record per probe: `[nonce, i, j, "value", tagged]` or `[nonce, i, j, "raised", type]`.

    Only the probes (the program calls) go in, and their results come out as tagged plain data; no
    comparison, literal or expected value of a test is in the program's process. The encoder runs
    there too and the program can tamper with it, which gains nothing: the parent accepts only plain
    values and judges them itself. The nonce keeps the records apart from ordinary prints.
    """
    probes = [list(t.probes) for t in tests]
    return "\n".join([
        code,
        "",
        _ENCODER,
        "def __rollart_run_tests(__probes, __nonce):",
        "    import json as __json",
        "    for __i, __exprs in enumerate(__probes):",
        "        for __j, __e in enumerate(__exprs):",
        "            try:",
        "                __rec = [__nonce, __i, __j, 'value', __rollart_plain(eval(__e, globals()))]",
        "            except BaseException as __exc:",
        "                __rec = [__nonce, __i, __j, 'raised', type(__exc).__name__]",
        "            print(__json.dumps(__rec), flush=True)",
        f"__rollart_run_tests({probes!r}, {nonce!r})",
    ])  # fmt: skip


def grade_results(stdout: str, nonce: str, tests: list[CodeTest]) -> list[bool]:
    """One verdict per test, decided here (outside the sandbox) from the reported plain values.

    A probe's value counts iff exactly one record for it exists, it says "value" and its payload
    decodes as plain data (`decode_plain`); anything else makes the probe fail, and a test fails
    when its check needs a failed probe or evaluates falsy. Duplicate records (the program printed
    its own) fail the probe; oversized lines are ignored. Total on any text.
    """
    records: dict[tuple[int, int], list[list[Any]]] = {}
    for line in stdout.splitlines():
        if nonce not in line or len(line) > MAX_RECORD_CHARS:
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, list) and len(rec) == 5 and rec[0] == nonce and type(rec[1]) is int and type(rec[2]) is int:
            records.setdefault((rec[1], rec[2]), []).append(rec)
    verdicts = []
    for i, test in enumerate(tests):
        values: dict[str, Any] = {}
        for j in range(len(test.probes)):
            recs = records.get((i, j), [])
            value: Any = _ProbeFailed(f"probe {j}")
            if len(recs) == 1 and recs[0][3] == "value":
                try:
                    value = decode_plain(recs[0][4])
                except Exception:  # hostile payload: ValueError, TypeError, RecursionError, MemoryError...
                    value = _ProbeFailed(f"probe {j} is not plain data")
            values[f"__probe_{j}"] = value
        try:
            ok = bool(evaluate_check(test.check, values))
        except Exception:  # a failed probe, a type error between values, an overflow...: the test fails
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

    def __init__(self, limits: SandboxLimits | None = None, max_attempts: int = 2, allow_unisolated: bool = False) -> None:
        """Load the shipped tasks; every run uses a fresh sandbox process under `limits`.

        `allow_unisolated=True` accepts the process fallback, where a run can read world-readable
        files such as the installed task data (tests and expected values): without it the env
        refuses to reset or step in that mode, since a policy would learn to read the answers.
        """
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
        self.allow_unisolated = allow_unisolated
        self._containment_checked = False

    async def _check_containment(self) -> None:
        """Refuse (or, when opted in, warn once about) a containment that shows the task data to the run."""
        if self._containment_checked:
            return
        containment = await self.sandbox.containment()
        if containment != "bwrap":
            if not self.allow_unisolated:
                raise EnvError(
                    f"code tasks need bubblewrap containment, got {containment!r}: in the process fallback a run can "
                    "read the installed task data (tests and expected values); install bubblewrap "
                    "(scripts/install_bubblewrap.sh) or pass allow_unisolated=True (env_args) to accept that"
                )
            log.warning(
                "code env runs unisolated (%s containment, allow_unisolated=True): programs can read the task data "
                "and any world-readable file; rewards are not trustworthy against a policy that looks",
                containment,
            )
        self._containment_checked = True

    async def reset(self, seed: int | None = None) -> ResetResult:
        """Pick the task for `seed` (after checking, once, that the sandbox hides the task data)."""
        # deps: CodeSandboxEnv._check_containment
        await self._check_containment()
        index = (seed or 0) % len(self._tasks)
        self._task, self._task_tests = self._tasks[index], self._tests[index]
        self._attempts = 0
        self._best = 0.0
        return ResetResult(self._task["prompt"], {"num_tests": len(self._task_tests)})

    async def step(self, action: str) -> StepResult:
        """Run the code block's test expressions in the sandbox; grade them here; reward = improvement."""
        # deps: CodeSandboxEnv._check_containment, extract_code, build_harness, PythonSandbox.run, grade_results
        await self._check_containment()
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
