"""Which engine a rollout pool runs, built where the worker lives (driver or Ray actor).

Why a picklable spec and not a factory closure: a Ray actor receives the spec and builds the engine
in its own process, on its own device. A plugin engine (entry point `rollart.engines`, or an import
path) is a callable `factory(model: ModelSpec, hardware: str, max_num_seqs: int, **engine_args)`
returning an object with rollart.proxy's Engine protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollart.app.model_source import ModelSpec

BUILTIN_ENGINES = ("torch", "vllm", "sim")


@dataclass(frozen=True)
class EngineSpec:
    """One pool's engine: kind, the model, the hardware, batch width and the engine's own arguments."""

    kind: str
    model: ModelSpec
    hardware: str
    max_num_seqs: int = 16
    engine_args: dict[str, Any] = field(default_factory=dict)
    tensor_parallel_size: int = 1

    def build(self) -> Any:
        """Construct the engine (loads weights for torch and vllm; sim holds none)."""
        args = dict(self.engine_args)
        if self.kind == "torch":
            from rollart.proxy.torch_engine import TorchEngine

            return TorchEngine(self.model.build_module(), max_num_seqs=self.max_num_seqs, **args)
        if self.kind == "vllm":
            from rollart.proxy.vllm_engine import VLLMEngine

            assert self.model.path is not None, "vllm needs model.path (checked by the config)"
            args.setdefault("dtype", self.model.dtype)
            args.setdefault("seed", self.model.seed)
            return VLLMEngine(self.model.path, max_num_seqs=self.max_num_seqs, **args)
        if self.kind == "sim":
            from rollart.proxy.sim_engine import SimEngine
            from rollart.resource.hardware import BUILTIN_HARDWARE

            return SimEngine(self.model.sim_spec(), BUILTIN_HARDWARE[self.hardware], max_num_seqs=self.max_num_seqs,
                             tensor_parallel_size=self.tensor_parallel_size, **args)
        from rollart.app.registry import resolve

        factory = resolve("engine", self.kind).obj
        return factory(self.model, self.hardware, self.max_num_seqs, **args)
