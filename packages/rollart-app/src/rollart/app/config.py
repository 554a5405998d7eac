"""The run config: YAML validated into pydantic models (design D11).

Why pydantic with `extra="forbid"` and `Literal`s: a typo in a key or a mode must fail before any
worker starts, and the error must say which field, what was given and what is allowed (R7).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollart import checks as check
from rollart.scheduler.errors import ConfigError

MODES = ("sync", "one_off", "async", "time_sharing")
POLICIES = ("cost_aware", "always_shrink")


class _Strict(BaseModel):
    # the docstring under each field is its description (the generated config reference shows it)
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class RunSection(_Strict):
    """Where and how long: run directory, iterations, seed, checkpoint cadence."""

    name: str = "run"
    """Run name: metrics, the progress line and the default run directory `runs/<name>-<timestamp>`."""
    run_dir: str | None = None
    """Run directory (metrics, timeline, checkpoints); `--run-dir` overrides it. Rerunning into it resumes."""
    iterations: int = Field(20, ge=1)
    """Training iterations (one batch, one optimizer step each); `-n` overrides it."""
    seed: int = 0
    """Seed of env resets, sampling and the tiny model's initialisation."""
    checkpoint_every: int = Field(1, ge=1)
    """Write a checkpoint every this many iterations."""
    tensorboard: bool = True
    """Mirror the metrics to TensorBoard logs in the run directory."""


class PipelineSection(_Strict):
    """The mode switch (D5) and the batch shape."""

    mode: Literal["sync", "one_off", "async", "time_sharing"] = "async"
    """What overlaps: `sync` (nothing), `one_off` (rollout one version behind), `async` (bounded staleness), `time_sharing` (`async` + lending rollout devices to training)."""
    alpha: int = Field(1, ge=0)
    """Asynchronous bound: a trajectory whose oldest token is more than `alpha` versions old is aborted; 0 in `sync`, 1 in `one_off`."""
    batch_size: int = Field(32, ge=1)
    """Trajectories per train step; a multiple of `group_size`."""
    group_size: int = Field(8, ge=1)
    """Trajectories per prompt (GRPO group); a batch takes complete groups only."""
    redundancy: float = Field(1.5, ge=1.0, le=8.0)
    """Groups kept in flight per batch group (>= 1): the extra ones absorb stragglers and are aborted when the batch is full."""
    balance_tasks: bool = True
    """Take batches with every task in proportion to its `weight` rather than first come, first served."""
    env_interaction: Literal["trajectory", "batch"] = "trajectory"
    """`trajectory`: every env steps as soon as its own turn is back (RollArt); `batch`: groups step in lockstep waves, each turn waiting for the slowest env (the baseline of design D24)."""
    get_batch_timeout_s: float = Field(600.0, gt=0)
    """Seconds to wait for a full batch before the run fails."""
    update_timeout_s: float = Field(60.0, gt=0)
    """Seconds a weight update (publish, fetch, load) may take."""

    @model_validator(mode="after")
    def _consistent(self) -> PipelineSection:
        if self.batch_size % self.group_size:
            raise ValueError(f"pipeline.batch_size must be a multiple of pipeline.group_size={self.group_size}, got {self.batch_size}")
        if self.mode == "sync" and self.alpha != 0:
            raise ValueError(f"pipeline.alpha must be 0 in mode 'sync' (serial, on-policy), got {self.alpha}")
        if self.mode == "one_off" and self.alpha != 1:
            raise ValueError(f"pipeline.alpha must be 1 in mode 'one_off', got {self.alpha}")
        return self


class TimeSharingSection(_Strict):
    """The controller's policy (D6) and its knobs."""

    policy: Literal["cost_aware", "always_shrink"] = "cost_aware"
    """`cost_aware` lends devices only when the expected gain beats the measured switch cost; `always_shrink` lends `lend` devices every step (the baseline)."""
    margin: float = Field(1.0, ge=0)
    """Lend only if the expected gain exceeds `margin` times the switch cost (`cost_aware`)."""
    min_keep: int = Field(1, ge=1)
    """Rollout devices never lent (`cost_aware`)."""
    lend: int = Field(1, ge=1)
    """Devices lent per train step (`always_shrink`)."""
    prior_switch_cost_s: float = Field(0.0, ge=0)
    """Assumed switch cost (s) until one has been measured (`cost_aware`)."""
    slots_per_device: int = Field(16, ge=1)
    """In-flight requests one rollout device serves; sizes the devices the remaining demand needs."""


ENGINES = ("torch", "vllm", "sim")
TRAINER_BACKENDS = ("torch", "megatron", "sim")
CHANNELS = ("local", "torch_dist", "mooncake", "sim")
SIM_MODELS = ("Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B")
DTYPES = ("float32", "bfloat16", "float16")
PROMPT_STYLES = ("auto", "demo", "chat_template")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class ClusterSection(_Strict):
    """Which Ray cluster runs the workers (design D16).

    `ray`: `none` runs every part in this process; `local` starts a Ray cluster on 127.0.0.1 with
    one logical GPU per configured device and one custom resource per hardware type; anything else
    is the address of an existing cluster (`HOST:PORT` or `ray://HOST:PORT`), which is left running.
    `devices`: the local cluster's inventory per hardware type (default: exactly what the pools and
    the trainer ask for); a config asking for more fails before anything starts.
    """

    ray: str = "none"
    """`none` (in-process), `local` (start Ray on 127.0.0.1) or an existing cluster's address (`HOST:PORT`, `ray://HOST:PORT`)."""
    devices: dict[str, int] | None = None
    """Inventory of the local cluster per hardware type (default: what the pools and the trainer ask for)."""

    @model_validator(mode="after")
    def _inventory(self) -> ClusterSection:
        for hw, n in (self.devices or {}).items():
            if isinstance(n, bool) or n < 0:
                raise ValueError(f"cluster.devices.{hw} must be an integer >= 0, got {n!r}")
        return self

    @property
    def uses_ray(self) -> bool:
        """True unless `ray: none`."""
        return self.ray != "none"

    @property
    def is_local(self) -> bool:
        """True when RollArt starts (and stops) the Ray cluster itself."""
        return self.ray == "local"


class ModelSection(_Strict):
    """The policy: the tiny locally built demo model, or a Hugging Face checkpoint directory.

    With `path`, the trainer and every engine load the same weights from the directory (config,
    safetensors, tokenizer with a chat template), so version 0 needs no transfer; the tiny fields
    are then ignored.
    """

    path: str | None = None
    """A Hugging Face checkpoint directory (config, safetensors, tokenizer); unset: the tiny demo model built locally."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype in the trainer and the engines."""
    hidden_size: int = Field(64, ge=8)
    """Tiny model: hidden size (ignored with `path`)."""
    num_layers: int = Field(2, ge=1)
    """Tiny model: decoder layers (ignored with `path`)."""
    num_heads: int = Field(4, ge=1)
    """Tiny model: attention heads (ignored with `path`)."""
    intermediate_size: int = Field(128, ge=8)
    """Tiny model: MLP width (ignored with `path`)."""
    max_positions: int = Field(128, ge=16)
    """Tiny model: maximum sequence length (ignored with `path`)."""
    sim_model: Literal["Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B"] | None = None
    """A simulated model's shape for `engine: sim` / `trainer.backend: sim` (parameters, layers, KV heads, experts; design D22, D60)."""

    @model_validator(mode="after")
    def _checkpoint(self) -> ModelSection:
        if self.path is None:
            return self
        root = Path(self.path).expanduser()
        if not root.is_dir():
            raise ValueError(f"model.path {self.path!r} is not a directory (a Hugging Face checkpoint directory is expected; "
                             f"a relative path in a config file is taken from the file's folder, one given with --set "
                             f"from the working directory; make a tiny one with `rollart checkpoint init {self.path}`)")
        if not (root / "config.json").is_file():
            raise ValueError(f"model.path {self.path!r} has no config.json")
        if not any((root / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"model.path {self.path!r} has no tokenizer (one of {list(TOKENIZER_FILES)}); "
                             "save one with tokenizer.save_pretrained(path)")
        return self


class RolloutPool(_Strict):
    """One pool of rollout workers on one hardware type, one worker per `tensor_parallel_size` devices."""

    name: str = Field(..., min_length=1)
    """Pool name, unique in `rollout.pools`."""
    hardware: str = "H800"
    """Hardware type of the pool's devices (a name from the rollart-resource catalogue, e.g. `H800`, `H20`)."""
    devices: int = Field(1, ge=1)
    """Devices in the pool; one inference worker per `tensor_parallel_size` of them."""
    engine: str = "torch"
    """Inference engine: `torch`, `vllm` or `sim` (simulated roofline engine)."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the engine (e.g. vLLM options)."""
    max_num_seqs: int = Field(16, ge=1)
    """Sequences one worker decodes together."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one engine shards the model over (vLLM); the pool runs `devices / tensor_parallel_size` engines,
    each on one node (one placement-group bundle); weights and KV split over the group (the simulator prices it,
    app D60). `torch` engines take 1."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """vLLM pools: the fraction of each GPU the engine may take (weights + KV); None: vLLM's default."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """vLLM pools: the engine's weight dtype; None: `model.dtype`."""

    @model_validator(mode="after")
    def _tensor_parallel(self) -> RolloutPool:
        tp = self.tensor_parallel_size
        if self.devices % tp:
            raise ValueError(f"rollout.pools.{self.name}.devices must be a multiple of tensor_parallel_size={tp} "
                             f"(each engine takes {tp} devices), got {self.devices}")
        if tp > 1 and self.engine == "torch":
            raise ValueError(f"rollout.pools.{self.name}.tensor_parallel_size: engine 'torch' runs one device per engine "
                             f"(allowed: 1), got {tp}; use engine: vllm to shard a model over devices")
        for knob in ("gpu_memory_utilization", "dtype"):
            if getattr(self, knob) is not None and self.engine != "vllm":
                raise ValueError(f"rollout.pools.{self.name}.{knob} applies to engine 'vllm' only, "
                                 f"got engine {self.engine!r}")
        return self

    @property
    def engines(self) -> int:
        """Engines (inference workers) in the pool: one per `tensor_parallel_size` devices."""
        return self.devices // self.tensor_parallel_size


class RecoverySection(_Strict):
    """How the proxy restarts and replaces rollout workers that die (rollart-proxy D22-D24, app D80).

    Defaults suit a long run: one in-place restart per worker per 10 minutes, then the worker is
    removed and a new one built on a free device of its pool's hardware (retried with backoff).
    """

    max_restarts: int = Field(1, ge=0, le=1000)
    """In-place restarts of one worker within `restart_window_s`; past it the worker is removed and replaced. 0: never restart in place, replace at once."""
    restart_window_s: float = Field(600.0, gt=0)
    """The window (seconds) over which `max_restarts` is counted; also bounds replacement attempts per slot."""
    restart_backoff_s: float = Field(1.0, ge=0)
    """Pause before the second restart in a window, doubled for each later one."""
    restart_backoff_max_s: float = Field(60.0, ge=0)
    """Cap of that pause."""
    health_check_interval_s: float | None = Field(5.0, gt=0)
    """Seconds between probes of every active worker (finds a dead idle worker); null: no health check."""
    health_check_timeout_s: float = Field(10.0, gt=0)
    """A probe unanswered this long counts as a failure."""

    def proxy_kwargs(self) -> dict[str, Any]:
        """The `LLMProxy` keyword arguments of this section."""
        return {"max_restarts": self.max_restarts, "restart_window_s": self.restart_window_s,
                "restart_backoff_s": self.restart_backoff_s, "restart_backoff_max_s": self.restart_backoff_max_s,
                "health_check_interval_s": self.health_check_interval_s,
                "health_check_timeout_s": self.health_check_timeout_s}


class RolloutSection(_Strict):
    """The rollout side: pools of inference workers (several hardware types in one run)."""

    pools: list[RolloutPool] = Field(default_factory=lambda: [RolloutPool(name="rollout", devices=2)], min_length=1)
    """The rollout pools; several hardware types in one run."""
    recovery: RecoverySection = Field(default_factory=RecoverySection)
    """Restart budget, backoff and health check for rollout workers that die."""

    @model_validator(mode="after")
    def _unique(self) -> RolloutSection:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rollout.pools names must be unique, got duplicates {dupes}")
        return self

    @property
    def devices(self) -> int:
        """Rollout devices over all pools."""
        return sum(p.devices for p in self.pools)


class RoutingSection(_Strict):
    """Hardware affinity (the paper's Listing 1): task tag -> hardware; `default` covers other tags."""

    affinity: dict[str, str] = Field(default_factory=dict)
    """Task tag -> hardware type of the pool that serves it; `default` covers the other tags."""
    policy: Literal["hard", "soft"] = "hard"
    """`hard`: a request waits for its preferred hardware; `soft`: it spills to any worker with room once every worker of its preferred hardware is full (rollart-proxy D51)."""


class SyncSection(_Strict):
    """How weights go from the trainer to the rollout workers (design D17)."""

    channel: Literal["local", "torch_dist", "mooncake", "sim"] = "local"
    """Weight transport: `local` (one process), `torch_dist` (broadcast over a torch.distributed group), `mooncake` (across clusters) or `sim` (a modelled transfer time in the simulator)."""
    bucket_mb: float = Field(64.0, gt=0, le=16384)
    """Size bound of one weight bucket (MB)."""
    keep_last: int = Field(2, ge=1)
    """Published versions the channel keeps."""
    checksums: bool = False
    """`torch_dist`: CRC-32 every bucket on both sides. Off by default: gloo runs over TCP and NCCL over links with
    their own CRC, so a torn bucket fails the collective (rollart-sync D42); on for a transport you distrust."""


REMOVED_TRAINER_FIELDS = {
    "algorithm": "it selected nothing: rollart.train has no critic, so every run trains GRPO group advantages "
                 "with the PPO-clip loss; `clip_eps`, `entropy_coef` and `normalize_advantage_std` tune it",
}
"""Keys the `trainer` section no longer has, with why; a config that still sets one fails naming it."""


class TrainerSection(_Strict):
    """The trainer: backend, where it runs, and the optimisation settings handed to rollart.train.

    `placement: driver` trains in this process (the embedded default); `placement: actors` runs
    `devices` data-parallel Ray actors on their own devices of `hardware` (disaggregated from
    rollout), gradients all-reduced over torch.distributed (gloo on CPU, NCCL on GPUs).

    There is one algorithm, so no field chooses it: GRPO advantages (reward minus the group mean,
    over the group's std unless `normalize_advantage_std: false`) with the PPO-clip policy loss
    (rollart.train has no critic, design rollart-train §1). The former `algorithm` key is an error.
    """

    backend: Literal["torch", "megatron", "sim"] = "torch"
    """Training backend: `torch`, `megatron` (megatron-core, the `[megatron]` extra of rollart-train) or `sim` (a step-time cost model for `rollart sim`)."""
    placement: Literal["driver", "actors"] = "driver"
    """`driver`: train in this process; `actors`: `devices` data-parallel Ray actors."""
    devices: int = Field(1, ge=1)
    """Data-parallel trainer replicas (with `placement: actors`)."""
    hardware: str = "H800"
    """Hardware type of the trainer's devices."""
    lr: float = Field(3e-3, gt=0)
    """AdamW learning rate."""
    clip_eps: float = Field(0.2, gt=0)
    """PPO clip range of the importance ratio."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of the entropy bonus."""
    normalize_advantage_std: bool = True  # False: Dr.GRPO advantages (reward - group mean), design D15
    """Divide advantages by the group's standard deviation; `false` gives Dr.GRPO advantages (reward - group mean)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient clipping norm."""
    micro_batch_size: int = Field(64, ge=1)
    """Sequences per forward/backward pass; gradients accumulate exactly over the batch."""
    forward_passes: list[Literal["old_policy", "reference"]] = Field(default_factory=lambda: ["old_policy", "reference"])
    """Forward-only passes of the RL step that `backend: sim` prices (design D61): `old_policy` (recomputed log-probs of the sampling policy), `reference` (the reference model's, for a KL term); `[]` for neither."""

    restarts: int = Field(2, ge=0, le=100)
    """Rebuilds of the trainer group from the last checkpoint per run when a trainer actor dies (`placement: actors`, `sync.channel: local`); past it the run stops naming the actor and the resume command."""

    @model_validator(mode="after")
    def _forward_passes_once(self) -> TrainerSection:
        if len(set(self.forward_passes)) != len(self.forward_passes):
            raise ValueError(f"trainer.forward_passes: each pass at most once (allowed: old_policy, reference), got {self.forward_passes}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        # A key that was removed gets its own message: "extra inputs are not permitted" would not say
        # why, and a config written for an earlier version must not look like it had a typo.
        if isinstance(data, dict):
            for key, why in REMOVED_TRAINER_FIELDS.items():
                if key in data:
                    raise ValueError(f"trainer.{key}: removed ({why}); delete the key (got {data[key]!r})")
        return data


class RewardService(_Strict):
    """A reward scored by a Reward-as-a-Service endpoint (`rollart reward serve`)."""

    service: str = Field(..., min_length=1)
    """Base URL of the reward service (`rollart reward serve`)."""
    name: str = "default"
    """Reward function name in the service's registry."""
    token_env: str | None = None
    """Environment variable holding the service's bearer token."""
    deadline_s: float = Field(60.0, gt=0)
    """Seconds one scoring call may take, retries included."""


class TaskSection(_Strict):
    """One environment of the mix: which env, which reward, how prompts are rendered, its routing tag.

    `env` and `reward` are a built-in name (`frozenlake`, `math`, `code`), a plugin name (entry
    points `rollart.envs` / `rollart.rewards`), or an import path (`pkg.mod:Name`, `file.py:Name`);
    `reward` may also be a reward service. `reward` defaults to the env's built-in reward when there
    is one. `prompts: auto` is `demo` for the tiny model and `chat_template` for a checkpoint.
    """

    env: str = Field(..., min_length=1)
    """The environment: a built-in name (`frozenlake`, `math`, `code`), a plugin name or an import path (`pkg.mod:Name`, `file.py:Name`)."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the environment's constructor."""
    reward: str | RewardService | None = None
    """The reward: a name, an import path or a reward service; default: the env's built-in reward."""
    prompts: Literal["auto", "demo", "chat_template"] = "auto"
    """How observations become prompts: `demo` (tiny model), `chat_template` (the tokenizer's), `auto` (by model)."""
    system_prompt: str = ""
    """System message of chat-template prompts."""
    tag: str = "default"
    """Routing tag of the task's requests (see `routing.affinity`)."""
    weight: float = Field(1.0, gt=0)
    """Share of the task in the mix and in balanced batches."""
    max_turns: int = Field(8, ge=1)
    """Turns per trajectory before it is truncated."""
    max_tokens: int = Field(2, ge=1)
    """Tokens generated per turn."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature."""
    max_total_tokens: int = Field(4096, ge=1)
    """Generated tokens per trajectory before it is truncated."""
    max_context_tokens: int = Field(8192, ge=1)
    """Prompt + response tokens of one turn's context before the trajectory is truncated."""
    env_timeout_s: float = Field(30.0, gt=0)
    """Seconds one env reset/step may take; past it the trajectory fails with `env_timeout`."""
    llm_timeout_s: float | None = Field(None, gt=0)
    """Seconds one generate call may take; default `pipeline.get_batch_timeout_s`."""

    @property
    def name(self) -> str:
        """A short name for metrics: the env spec's last component."""
        return self.env.rpartition(":")[2].rpartition("/")[2].removesuffix(".py")


class RunConfig(_Strict):
    """The whole run: pipeline, model, rollout pools, routing, trainer, sync, cluster and tasks."""

    run: RunSection = Field(default_factory=RunSection)
    """Run directory, iterations, seed, checkpoints."""
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    """Mode and batch shape."""
    time_sharing: TimeSharingSection = Field(default_factory=TimeSharingSection)
    """Lending rollout devices to training."""
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    """Which Ray cluster runs the workers."""
    model: ModelSection = Field(default_factory=ModelSection)
    """The policy model."""
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    """Rollout pools."""
    routing: RoutingSection = Field(default_factory=RoutingSection)
    """Hardware affinity per task tag."""
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    """Trainer backend, placement and optimisation."""
    sync: SyncSection = Field(default_factory=SyncSection)
    """Weight transport from trainer to rollout."""
    tasks: list[TaskSection] = Field(default_factory=lambda: [TaskSection(env="frozenlake")], min_length=1)
    """The environments of the mix, with their rewards."""

    @model_validator(mode="after")
    def _composition(self) -> RunConfig:
        check_composition(self)
        return self


def check_composition(config: RunConfig) -> None:
    """Cross-section rules: names that exist, tags that reach a pool, devices that fit (design D16).

    Raises ValueError naming the dotted field, the value and what is allowed (pydantic turns it into
    a ConfigError line).
    """
    from rollart.app.registry import is_import_path, known_names
    from rollart.resource.hardware import BUILTIN_HARDWARE

    hardware = sorted(BUILTIN_HARDWARE)
    engines = known_names("engine")
    for i, pool in enumerate(config.rollout.pools):
        if pool.hardware not in BUILTIN_HARDWARE:
            raise ValueError(f"rollout.pools.{i}.hardware: unknown hardware {pool.hardware!r}; allowed: {hardware}")
        if pool.engine not in engines and not is_import_path(pool.engine):
            raise ValueError(f"rollout.pools.{i}.engine: unknown engine {pool.engine!r}; allowed: {engines} "
                             "or an import path package.module:EngineClass")
        if pool.engine == "vllm" and config.model.path is None:
            raise ValueError(f"rollout.pools.{i}.engine: 'vllm' needs model.path (a Hugging Face checkpoint directory)")
    if config.trainer.hardware not in BUILTIN_HARDWARE:
        raise ValueError(f"trainer.hardware: unknown hardware {config.trainer.hardware!r}; allowed: {hardware}")
    pool_hw = sorted({p.hardware for p in config.rollout.pools})
    for tag, hw in config.routing.affinity.items():
        if hw not in pool_hw:
            raise ValueError(f"routing.affinity.{tag}: hardware {hw!r} has no rollout pool; pools run on {pool_hw}")
    affinity = config.routing.affinity
    for i, task in enumerate(config.tasks):
        if affinity and task.tag not in affinity and "default" not in affinity:
            raise ValueError(f"tasks.{i}.tag: {task.tag!r} has no entry in routing.affinity (keys: {sorted(affinity)}) "
                             "and there is no 'default'")
    if config.trainer.placement == "actors" and not config.cluster.uses_ray:
        raise ValueError("trainer.placement: 'actors' needs a Ray cluster; set cluster.ray to 'local' or an address")
    if config.trainer.placement == "actors" and config.trainer.devices > 1 and config.sync.channel == "local":
        raise ValueError(f"trainer.devices: {config.trainer.devices} replicas need a data-parallel group, which "
                         "sync.channel torch_dist or mooncake forms; use trainer.devices: 1 with sync.channel: local")
    check_simulation(config)
    if config.sync.channel not in ("local", "sim") and config.trainer.placement != "actors":
        raise ValueError(f"sync.channel: {config.sync.channel!r} moves weights from trainer actors; "
                         "set trainer.placement: actors, or use sync.channel: local")
    if config.trainer.placement == "actors" and config.sync.channel != "local":
        for i, pool in enumerate(config.rollout.pools):
            if pool.engine == "sim":
                raise ValueError(f"rollout.pools.{i}.engine: 'sim' holds no weights; use sync.channel: local with it")
    if config.trainer.placement == "actors" and config.pipeline.mode == "sync":
        raise ValueError("pipeline.mode: 'sync' colocates training on the rollout devices; "
                         "use trainer.placement: driver with it")
    if config.cluster.devices is not None:
        need = required_devices(config)
        for hw, n in sorted(need.items()):
            have = config.cluster.devices.get(hw, 0)
            if n > have:
                raise ValueError(f"cluster.devices.{hw}: the pools and the trainer need {n} {hw} devices, "
                                 f"the cluster has {have}")


def check_simulation(config: RunConfig) -> None:
    """Simulated parts go together (design D22): a sim trainer or channel moves a version token, not
    weights, so every pool must be a SimEngine; a simulated model shape has no weights to load."""
    sim_trainer = config.trainer.backend == "sim"
    sim_sync = config.sync.channel == "sim"
    if sim_trainer and config.trainer.placement != "driver":
        raise ValueError("trainer.placement: backend 'sim' is a cost model in the driver; use placement: driver")
    if sim_sync and not sim_trainer:
        raise ValueError("sync.channel: 'sim' moves a version token; it needs trainer.backend: sim")
    if sim_trainer and config.model.path is not None:
        raise ValueError("model.path: a simulated trainer loads no checkpoint; use model.sim_model for the shape")
    if config.model.sim_model is not None and not sim_trainer:
        raise ValueError(f"model.sim_model: {config.model.sim_model!r} has no weights; it needs trainer.backend: sim")
    if sim_trainer or sim_sync:
        for i, pool in enumerate(config.rollout.pools):
            if pool.engine != "sim":
                raise ValueError(f"rollout.pools.{i}.engine: {pool.engine!r} needs real weights; with trainer.backend: sim "
                                 "every pool uses engine: sim")


def required_devices(config: RunConfig) -> dict[str, int]:
    """Devices per hardware type the run occupies: every pool plus the trainer's own."""
    need: dict[str, int] = {}
    for pool in config.rollout.pools:
        need[pool.hardware] = need.get(pool.hardware, 0) + pool.devices
    if config.pipeline.mode != "sync":
        need[config.trainer.hardware] = need.get(config.trainer.hardware, 0) + config.trainer.devices
    return need


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] | None = None) -> type[BaseModel] | None:
    model: Any = root or RunConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def format_validation_error(err: ValidationError, root: type[BaseModel] | None = None) -> str:
    """One line per problem: dotted field path, message, offending value, allowed values (fields of `root`)."""
    lines = []
    for e in err.errors():
        loc = tuple(e.get("loc", ()))
        path = ".".join(str(p) for p in loc) or "<config>"
        msg = e.get("msg", "invalid")
        got = e.get("input")
        line = f"{path}: {msg} (got {got!r})"
        if e.get("type") == "value_error":
            # our cross-field rules name their own dotted field, value and allowed values
            text = msg.removeprefix("Value error, ")
            line = text if not loc or text.startswith(".".join(str(p) for p in loc)) else f"{path}: {text}"
        elif e.get("type") == "extra_forbidden":
            parent = _model_at(loc[:-1], root)
            if parent is not None:
                line += f"; allowed fields: {sorted(parent.model_fields)}"
        elif e.get("type") == "literal_error":
            line += f"; allowed: {e.get('ctx', {}).get('expected', '')}"
        lines.append(line)
    return "invalid run config:\n  " + "\n  ".join(lines)


def parse_config(data: dict[str, Any]) -> RunConfig:
    """Validate a mapping (from YAML or code) into a RunConfig.

    Raises:
        ConfigError: naming each offending field, its value and the allowed values.
    """
    # deps: format_validation_error
    # VAL: VAL_TYPE(data, dict, exc=ConfigError)
    check.of_type("data", data, dict, exc=ConfigError)  # generated #1c932bdabb
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


CONFIG_PATHS = (("model", "path"), ("run", "run_dir"))


def resolve_paths(data: Any, base_dir: Path) -> Any:
    """The config file's relative paths (`CONFIG_PATHS`) taken from its folder `base_dir` (app D57).

    Env and reward import paths (`file.py:Name`) were already resolved there; `model.path` and
    `run.run_dir` were taken from the working directory, so a config behaved differently by where
    it was run from. Anything that is not a mapping is left to `parse_config` to refuse.
    """
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for section, key in CONFIG_PATHS:
        part = out.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), str) and part[key]:
            value = Path(part[key]).expanduser()
            if not value.is_absolute():
                out[section] = {**part, key: os.path.normpath(Path(base_dir) / value)}
    return out


def load_config(path: str | Path) -> RunConfig:
    """Read YAML and validate it; errors become ConfigError naming field paths and allowed values."""
    # deps: parse_config, resolve_paths, yaml.safe_load
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read run config {str(path)!r}: {err}") from None
    return parse_config(resolve_paths(data if data is not None else {}, Path(path).resolve().parent))
