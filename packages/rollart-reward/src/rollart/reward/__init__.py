"""rollart.reward: Stateless reward functions (rules, LLM judge) and Reward-as-a-Service over HTTP with a retrying client."""

from rollart.reward.errors import RewardError, RewardRequestError, RewardTimeoutError
from rollart.reward.protocol import RewardFn, RewardRegistry, RewardResult

__version__ = "0.1.0"

__all__ = ["RewardError", "RewardFn", "RewardRegistry", "RewardRequestError", "RewardResult", "RewardTimeoutError"]
