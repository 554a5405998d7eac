"""Exceptions of rollart.reward.

The client's errors say which limit ended a batch (`limit`): the caller's deadline
(`RewardTimeoutError`), the attempt cap (`RewardAttemptsExhaustedError`) or a status the service
will answer the same way again (`RewardRequestError`), so a caller knows whether to retry later,
raise a limit, or fix its request.
"""

from __future__ import annotations


class RewardError(Exception):
    """Base class of rollart.reward errors (also raised by validation with a clear message)."""


class RewardRequestError(RewardError):
    """The service rejected a request (4xx other than 429): the caller's fault, never retried."""

    limit = "status"

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message} (non-retryable status; not retried)")
        self.status = status
        self.code = code
        self.message = message


class RewardGaveUpError(RewardError):
    """The client stopped retrying a batch; `limit` says which limit ended it."""

    limit = "unknown"

    def __init__(self, message: str, *, attempts: int, elapsed_s: float, unscored: int, last_problem: str) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.unscored = unscored
        self.last_problem = last_problem


class RewardTimeoutError(RewardGaveUpError):
    """The batch was not fully scored before the caller's deadline (`limit == "deadline"`)."""

    limit = "deadline"


class RewardAttemptsExhaustedError(RewardGaveUpError):
    """The client's `max_attempts` ran out before the deadline (`limit == "attempts"`)."""

    limit = "attempts"
