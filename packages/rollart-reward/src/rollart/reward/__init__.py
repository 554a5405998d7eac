"""rollart.reward: Stateless reward functions (rules, LLM judge) and Reward-as-a-Service over HTTP with a retrying client."""

__version__ = "0.1.0"
