"""`rollart plan`: resolve every part of a run config and estimate memory per device, starting nothing (D18).

Why pure functions returning dataclasses: the CLI renders the plan with rich, the tests assert on
the numbers, and the builder can reuse the preflight; none of them needs Ray, an engine or a GPU.
The memory model is a closed form over the HF config shape; its assumptions are listed in
`ASSUMPTIONS` and printed with every plan.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rollart import checks as check
from rollart.app.config import RunConfig, required_devices
from rollart.scheduler.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GB = 1e9
ASSUMPTIONS = (
    "rollout: per device, 1/tensor_parallel_size of a weight replica; KV cache (split by KV heads) for max_num_seqs "
    "sequences at the full context (engine_args.max_model_len, else the model's max positions): a worst case",
    "trainer torch: DDP, nothing sharded: weights + grads + AdamW's two moments, all in the model dtype",
    "trainer megatron: bf16 mixed precision with the distributed optimizer: weights (dtype) + fp32 main grads "
    "replicated, fp32 master weights + Adam moments (12 B/param) sharded over trainer.devices",
    "trainer sim (a preset model): rollart-train's sharded minimum, 18 B/param over trainer.devices + one sequence's "
    "activations at the longest max_context_tokens; a trainer over 90% of HBM is refused",
    "not counted (torch, megatron): activations; everywhere: CUDA context, allocator fragmentation (a lower bound)",
)


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the memory estimate needs, from `model.path`'s config.json or the tiny fields."""

    source: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    tie_word_embeddings: bool
    qkv_bias: bool
    dtype: str
    n_params: int | None = None  # a simulated model's published count (its MoE experts are not in the dense formula)


def model_shape(config: RunConfig) -> ModelShape:
    """Read the shape of the configured model (config.json of a checkpoint, else the tiny demo Llama)."""
    m = config.model
    if m.sim_model is not None:  # a simulated model: the published shape of the preset (D60)
        from rollart.proxy.sim_engine import SIM_MODEL_SPECS

        s = SIM_MODEL_SPECS[m.sim_model]
        return ModelShape(f"simulated {s.name}", s.vocab_size, s.hidden_size, s.n_layers, s.n_heads or s.n_kv_heads,
                          s.n_kv_heads, s.head_dim, 0, max(t.max_context_tokens for t in config.tasks), False, False,
                          "bfloat16", n_params=int(s.n_params))
    if m.path is None:
        from rollart.app.tasks import VOCAB

        return ModelShape("tiny demo Llama (model.* fields)", len(VOCAB), m.hidden_size, m.num_layers, m.num_heads,
                          m.num_heads, m.hidden_size // m.num_heads, m.intermediate_size, m.max_positions, False, False, m.dtype)
    path = Path(m.path).expanduser() / "config.json"
    try:
        hf = json.loads(path.read_text())
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        return ModelShape(
            source=f"{path} ({hf.get('model_type', '?')})",
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            intermediate_size=int(hf["intermediate_size"]),
            max_positions=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=bool(hf.get("attention_bias", hf.get("model_type") == "qwen2")),
            dtype=m.dtype,
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"model.path: cannot read the model shape from {str(path)!r}: {type(err).__name__}: {err}") from None


def param_count(shape: ModelShape) -> int:
    """Parameters of a Llama/Qwen2-style decoder: embeddings, GQA attention, gated MLP, RMSNorms, lm_head unless tied."""
    if shape.n_params is not None:
        return shape.n_params
    h, q_out, kv_out = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    attention = h * q_out + 2 * h * kv_out + q_out * h + ((q_out + 2 * kv_out) if shape.qkv_bias else 0)
    mlp = 3 * h * shape.intermediate_size
    per_layer = attention + mlp + 2 * h
    embeddings = shape.vocab_size * h
    head = 0 if shape.tie_word_embeddings else shape.vocab_size * h
    return embeddings + shape.num_layers * per_layer + h + head


def kv_bytes_per_token(shape: ModelShape) -> int:
    """2 (K and V) x layers x KV heads x head dim x dtype bytes."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * DTYPE_BYTES[shape.dtype]


@dataclass(frozen=True)
class DeviceMemory:
    """Estimated bytes on one device of a role, and the hardware's HBM (0: a CPU slot, not checked)."""

    weights: int
    kv_cache: int = 0
    grads: int = 0
    optimizer: int = 0
    hbm: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        """Everything counted."""
        return self.weights + self.kv_cache + self.grads + self.optimizer + self.activations

    @property
    def over(self) -> bool:
        """True when the estimate exceeds the device's HBM."""
        return self.hbm > 0 and self.total > self.hbm


@dataclass(frozen=True)
class PoolPlan:
    """Where one rollout pool runs and what each of its devices holds."""

    name: str
    hardware: str
    devices: int
    engine: str
    engine_origin: str
    max_num_seqs: int
    max_context: int
    memory: DeviceMemory
    tensor_parallel_size: int = 1
    device_kind: str = "cpu"
    """Where its engines run on a GPU cluster (cuda for hardware with device memory, D70); `sim`: none."""
    tp_groups: tuple[tuple[int, ...], ...] = ()
    """The pool's device indices per engine: each group is one placement-group bundle on one node (D71)."""


@dataclass(frozen=True)
class TrainerPlan:
    """Where the trainer runs and what each of its devices holds."""

    backend: str
    placement: str
    devices: int
    hardware: str
    memory: DeviceMemory
    device_kind: str = "cpu"
    dp_backend: str = "gloo"
    """The data-parallel group's collective backend on a GPU cluster (nccl when every replica is on CUDA)."""


@dataclass(frozen=True)
class RoutePlan:
    """One routing entry: a tag, the hardware it goes to (None: any), the pools there and the tasks using it."""

    tag: str
    hardware: str | None
    pools: list[str]
    tasks: list[str]


@dataclass(frozen=True)
class TaskPlan:
    """One task as resolved: what runs the env, what scores it, how prompts are rendered."""

    index: int
    name: str
    tag: str
    env_origin: str
    reward_origin: str
    prompts: str


@dataclass
class Plan:
    """Everything `rollart plan` prints."""

    model: ModelShape
    params: int
    pools: list[PoolPlan]
    trainer: TrainerPlan
    sync_channel: str
    bucket_mb: float
    routes: list[RoutePlan]
    tasks: list[TaskPlan]
    devices: dict[str, int]
    cluster: str
    warnings: list[str] = field(default_factory=list)
    sync_backend: str = "gloo"
    """The torch_dist weight channel's backend on a GPU cluster ('refused: mixed' for a mixed world, D72)."""
    assumptions: tuple[str, ...] = ASSUMPTIONS


def _hbm(hardware: str) -> int:
    from rollart.resource.hardware import BUILTIN_HARDWARE

    return int(BUILTIN_HARDWARE[hardware].hbm_gb * GB)


def rollout_memory(shape: ModelShape, max_num_seqs: int, max_context: int, hardware: str, tp: int = 1) -> DeviceMemory:
    """One device of a rollout engine over `tp` devices: its share of the weights in the model dtype + of the KV
    cache for max_num_seqs x max_context tokens (KV split by heads, so at most num_kv_heads ways; D60)."""
    # deps: param_count, kv_bytes_per_token
    weights = -(-param_count(shape) * DTYPE_BYTES[shape.dtype] // tp)
    kv = -(-kv_bytes_per_token(shape) * max_num_seqs * max_context // min(tp, shape.num_kv_heads))
    return DeviceMemory(weights=weights, kv_cache=kv, hbm=_hbm(hardware))


def gpu_placement(config: RunConfig) -> tuple[list[str], str, str, str]:
    """Device kind per pool and for the trainer, the trainer's DP backend and the sync channel's backend on a GPU
    cluster, from the hardware catalogue (rollart-resource D35/D36); a mixed sync world reads 'refused: ...'."""
    # deps: device_kind_for_hardware, collective_backend
    from rollart.resource.accelerators import BACKENDS, MixedWorldError, collective_backend, device_kind_for_hardware
    from rollart.resource.hardware import BUILTIN_HARDWARE

    def kind(hw: str, engine: str) -> str:
        return "sim" if engine == "sim" else device_kind_for_hardware(BUILTIN_HARDWARE[hw].hbm_gb)

    pools = [kind(p.hardware, p.engine) for p in config.rollout.pools]
    trainer = kind(config.trainer.hardware, config.trainer.backend)
    dp = BACKENDS.get(trainer, "-")
    members = [k for k in [trainer, *pools] if k != "sim"]
    if config.sync.channel != "torch_dist" or not members:
        return pools, trainer, dp, "-"
    try:
        return pools, trainer, dp, collective_backend(members)
    except MixedWorldError:
        return pools, trainer, dp, "refused: mixed cuda/cpu world"


def trainer_memory(shape: ModelShape, backend: str, devices: int, hardware: str) -> DeviceMemory:
    """One trainer device under the backend's assumption (see ASSUMPTIONS)."""
    # deps: param_count
    # VAL: VAL_ONE_OF(backend, choices=("torch", "megatron", "sim"), exc=ConfigError)
    check.one_of("backend", backend, ("torch", "megatron", "sim"), exc=ConfigError)  # generated #4e1d0fe850
    # VAL: VAL_INT_RANGE(devices, min=1, max=1_000_000, exc=ConfigError)
    check.int_range("devices", devices, min=1, max=1_000_000, exc=ConfigError)  # generated #3b73be281e
    if backend == "sim":  # a cost model holds no weights: nothing to fit
        return DeviceMemory(weights=0, grads=0, optimizer=0, hbm=_hbm(hardware))
    n, b = param_count(shape), DTYPE_BYTES[shape.dtype]
    if backend == "torch":
        return DeviceMemory(weights=n * b, grads=n * b, optimizer=2 * n * b, hbm=_hbm(hardware))
    return DeviceMemory(weights=n * b, grads=4 * n, optimizer=-(-12 * n // devices), hbm=_hbm(hardware))


def sim_trainer_memory(config: RunConfig) -> Any:
    """rollart-train's memory model (its D24) of a simulated trainer of a preset model; None for any other trainer.

    Devices: `trainer.devices` (in `sync` mode at most the rollout devices it is colocated on); context:
    the longest `tasks[].max_context_tokens`."""
    # deps: trainer_memory
    if config.trainer.backend != "sim" or config.model.sim_model is None:
        return None
    from rollart.proxy.sim_engine import SIM_MODEL_SPECS
    from rollart.resource.hardware import BUILTIN_HARDWARE
    from rollart.train.sim_memory import trainer_memory as sharded_memory

    spec = SIM_MODEL_SPECS[config.model.sim_model]
    t = config.trainer
    devices = min(t.devices, config.rollout.devices) if config.pipeline.mode == "sync" else t.devices
    devices += lendable_devices(config)  # time-sharing: the step may run on lent devices too (D69)
    context = max(task.max_context_tokens for task in config.tasks)
    return sharded_memory(spec.name, spec.n_params, spec.n_layers, spec.hidden_size, spec.vocab_size, context, devices,
                          BUILTIN_HARDWARE[t.hardware])


def lendable_devices(config: RunConfig) -> int:
    """Rollout devices a time-sharing policy can lend to one train step (0 outside `time_sharing`).

    `cost_aware` keeps `min_keep`, `always_shrink` lends at most `lend`; both keep one device."""
    if config.pipeline.mode != "time_sharing":
        return 0
    ts, pool = config.time_sharing, config.rollout.devices
    most = pool - ts.min_keep if ts.policy == "cost_aware" else min(ts.lend, pool - 1)
    return max(0, min(most, pool - 1))


def required_lend(config: RunConfig) -> int:
    """Devices every time-shared train step must borrow because the trainer's own cannot hold the model (D69)."""
    # deps: sim_trainer_memory
    if config.pipeline.mode != "time_sharing":
        return 0
    memory = sim_trainer_memory(config)
    if memory is None or memory.min_devices is None:
        return 0
    return max(0, memory.min_devices - config.trainer.devices)


def check_trainer_fits(config: RunConfig) -> None:
    """Refuse a simulated trainer that cannot hold its model (D61): a ConfigError naming the shortfall."""
    # deps: sim_trainer_memory
    memory = sim_trainer_memory(config)
    if memory is not None and not memory.fits:
        raise ConfigError(f"{memory.shortfall()} (set trainer.devices or trainer.hardware)")


def routing_table(config: RunConfig) -> list[RoutePlan]:
    """tag -> hardware -> pools, and which tasks use each tag (no affinity: every tag may use every pool)."""
    affinity = config.routing.affinity
    tags = sorted({t.tag for t in config.tasks} | set(affinity))
    out = []
    for tag in tags:
        hw = affinity.get(tag, affinity.get("default")) if affinity else None
        pools = [p.name for p in config.rollout.pools if hw is None or p.hardware == hw]
        tasks = [f"tasks.{i} ({t.name})" for i, t in enumerate(config.tasks) if t.tag == tag]
        out.append(RoutePlan(tag, hw, pools, tasks))
    return out


def load_tokenizer(config: RunConfig) -> Any:
    """The checkpoint's tokenizer (transformers, local files only), or the demo tokenizer for the tiny model."""
    if config.model.path is None:
        from rollart.app.tasks import build_demo_tokenizer

        return build_demo_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(config.model.path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - any loader failure is a config problem here
        raise ConfigError(f"model.path: cannot load the tokenizer from {config.model.path!r}: {type(err).__name__}: {err}") from None


def engine_origin(spec: str, base_dir: Path | None, field: str) -> str:
    """Where an engine comes from, without importing a built-in one (its module imports torch: seconds).

    A built-in engine's module is located (`find_spec`, which fails if the package is missing) but not
    executed; a plugin or import path is resolved as the run would resolve it.
    """
    # deps: resolve
    from rollart.app.registry import BUILTINS, resolve

    path = BUILTINS["engine"].get(spec)
    if path is None:
        return resolve("engine", spec, base_dir, field=field).origin
    module = path.split(":", 1)[0]
    # AST: AST_PRECONDITION(importlib.util.find_spec(module) is not None, got=(field, module), msg="the module of a built-in engine is installed", exc=ConfigError)
    check.precondition(importlib.util.find_spec(module) is not None, "the module of a built-in engine is installed", got=(field, module), exc=ConfigError)  # generated #f642bd43f8
    return f"built-in ({path})"


def make_plan(config: RunConfig, base_dir: Path | None = None, tokenizer: Any = None) -> Plan:
    """Resolve every engine, env and reward (ConfigError naming the field on the first bad one) and lay out the run.

    Nothing is started: no Ray, no engine, no connection to a reward service.
    """
    # deps: model_shape, param_count, rollout_memory, trainer_memory, routing_table, load_tokenizer, engine_origin, build_task
    from rollart.app.task_factory import build_task

    shape = model_shape(config)
    kinds, trainer_kind, dp_backend, sync_backend = gpu_placement(config)
    pools = []
    for i, pool in enumerate(config.rollout.pools):
        origin = engine_origin(pool.engine, base_dir, field=f"rollout.pools.{i}.engine")
        context = int(pool.engine_args.get("max_model_len") or shape.max_positions)
        tp = pool.tensor_parallel_size
        pools.append(PoolPlan(pool.name, pool.hardware, pool.devices, pool.engine, origin, pool.max_num_seqs, context,
                              rollout_memory(shape, pool.max_num_seqs, context, pool.hardware, tp), tp, kinds[i],
                              tuple(tuple(range(s, s + tp)) for s in range(0, pool.devices, tp))))
    t = config.trainer
    check_trainer_fits(config)
    trainer = TrainerPlan(t.backend, t.placement, t.devices, t.hardware, trainer_memory(shape, t.backend, t.devices, t.hardware),
                          trainer_kind, dp_backend)
    sim = sim_trainer_memory(config)
    if sim is not None:  # the simulated trainer's sharded states and activations (rollart-train D24)
        trainer = TrainerPlan(t.backend, t.placement, sim.devices, t.hardware, DeviceMemory(
            weights=int(sim.weights), grads=int(sim.grads), optimizer=int(sim.optimizer), hbm=trainer.memory.hbm,
            activations=int(sim.activations)), trainer_kind, dp_backend)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
    tasks = []
    for i, task in enumerate(config.tasks):
        parts = build_task(task, i, config, tokenizer, base_dir)
        for close in parts.closers:
            result = close()
            if inspect.iscoroutine(result):
                result.close()  # nothing was opened (no score was made), so there is nothing to await
        tasks.append(TaskPlan(i, task.name, task.tag, parts.env_origin, parts.reward_origin, parts.prompts))
    warnings = []
    for p in pools:
        if shape.num_heads % p.tensor_parallel_size:
            warnings.append(f"rollout.pools.{p.name}.tensor_parallel_size={p.tensor_parallel_size} does not divide the "
                            f"model's {shape.num_heads} attention heads (vLLM shards heads evenly)")
        if p.memory.over:
            warnings.append(f"rollout.pools.{p.name}: estimated {p.memory.total / GB:.1f} GB per device exceeds "
                            f"{p.hardware}'s {p.memory.hbm / GB:.0f} GB (lower max_num_seqs or engine_args.max_model_len)")
    if sync_backend.startswith("refused"):
        warnings.append(f"sync: the torch_dist world mixes cuda and cpu members (pools {kinds}, trainer {trainer_kind}); "
                        "the run refuses it: give every member GPUs or none")
    if trainer.memory.over:
        warnings.append(f"trainer: estimated {trainer.memory.total / GB:.1f} GB per device exceeds "
                        f"{trainer.hardware}'s {trainer.memory.hbm / GB:.0f} GB (more trainer.devices, or backend megatron)")
    return Plan(shape, param_count(shape), pools, trainer, config.sync.channel, config.sync.bucket_mb, routing_table(config),
                tasks, required_devices(config), config.cluster.ray, warnings, sync_backend)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,}"


def _gb(n: int) -> str:
    return f"{n / GB:.2f}" if n >= 0.01 * GB else f"{n / 1e6:.2f} MB"


def render_plan(plan: Plan, console: Console) -> None:
    """Print the plan as rich tables: model, pools, trainer, sync, routing, tasks, warnings, assumptions."""
    m = plan.model
    console.print(f"[bold]model[/bold] {m.source}: {_count(plan.params)} params, {m.dtype}, {m.num_layers} layers, "
                  f"{m.num_heads} heads / {m.num_kv_heads} KV heads x {m.head_dim}, KV {kv_bytes_per_token(m)} B/token")
    console.print(f"[bold]cluster[/bold] ray: {plan.cluster}; devices needed: "
                  + ", ".join(f"{hw} x {n}" for hw, n in sorted(plan.devices.items())))
    pools = Table(title="rollout pools (memory per device, GB)")
    for col in ("pool", "hardware", "devices", "device", "TP groups", "engine", "max_num_seqs", "context", "weights",
                "KV cache", "total", "HBM"):
        pools.add_column(col)
    for p in plan.pools:
        style = "red" if p.memory.over else None
        groups = f"{len(p.tp_groups)} x TP {p.tensor_parallel_size}: " + " ".join(
            "[" + ",".join(map(str, g)) + "]" for g in p.tp_groups)
        pools.add_row(p.name, p.hardware, str(p.devices), p.device_kind, groups,
                      f"{p.engine} [dim]({p.engine_origin})[/dim]", str(p.max_num_seqs),
                      str(p.max_context), _gb(p.memory.weights), _gb(p.memory.kv_cache), _gb(p.memory.total),
                      _gb(p.memory.hbm), style=style)
    console.print(pools)
    tr = plan.trainer
    trainer = Table(title="trainer (memory per device, GB)")
    for col in ("backend", "placement", "devices", "hardware", "device", "DP group", "weights", "grads", "optimizer",
                "activations", "total", "HBM"):
        trainer.add_column(col)
    trainer.add_row(tr.backend, tr.placement, str(tr.devices), tr.hardware, tr.device_kind, tr.dp_backend,
                    _gb(tr.memory.weights), _gb(tr.memory.grads), _gb(tr.memory.optimizer), _gb(tr.memory.activations),
                    _gb(tr.memory.total), _gb(tr.memory.hbm), style="red" if tr.memory.over else None)
    console.print(trainer)
    console.print(f"[bold]sync[/bold] channel {plan.sync_channel}, bucket {plan.bucket_mb:g} MB, "
                  f"backend on a GPU cluster: {plan.sync_backend}")
    routes = Table(title="routing (tag -> hardware -> pools)")
    for col in ("tag", "hardware", "pools", "tasks"):
        routes.add_column(col)
    for r in plan.routes:
        routes.add_row(r.tag, r.hardware or "any", ", ".join(r.pools) or "-", ", ".join(r.tasks) or "-")
    console.print(routes)
    tasks = Table(title="tasks")
    for col in ("#", "task", "tag", "env", "reward", "prompts"):
        tasks.add_column(col)
    for t in plan.tasks:
        tasks.add_row(str(t.index), t.name, t.tag, t.env_origin, t.reward_origin, t.prompts)
    console.print(tasks)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    console.print("[dim]memory assumptions:[/dim]")
    for a in plan.assumptions:
        console.print(f"[dim]  - {a}[/dim]")
