"""rollart.env: The async Env protocol, trajectory-level EnvManagers, shipped environments, timeouts, retries and redundant rollouts."""

from rollart.env.errors import (
    EnvCrashedError,
    EnvError,
    EnvProtocolError,
    EnvTimeoutError,
    LLMCallError,
    TransientEnvError,
)
from rollart.env.protocols import (
    Env,
    GenerationRequest,
    GenerationResult,
    LLMClient,
    PromptBuilder,
    ResetResult,
    SamplingParams,
    StepResult,
    TrajectorySink,
)
from rollart.env.trajectory import Trajectory, TrajectoryStatus, Turn

__version__ = "0.1.0"

__all__ = [
    "Env",
    "EnvCrashedError",
    "EnvError",
    "EnvProtocolError",
    "EnvTimeoutError",
    "GenerationRequest",
    "GenerationResult",
    "LLMCallError",
    "LLMClient",
    "PromptBuilder",
    "ResetResult",
    "SamplingParams",
    "StepResult",
    "Trajectory",
    "TrajectorySink",
    "TrajectoryStatus",
    "TransientEnvError",
    "Turn",
]
