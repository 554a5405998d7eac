"""Exceptions of rollart.reward."""

from __future__ import annotations


class RewardError(Exception):
    """Base class of rollart.reward errors (also raised by validation with a clear message)."""


class RewardRequestError(RewardError):
    """The service rejected a request (4xx other than 429): the caller's fault, never retried."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class RewardTimeoutError(RewardError):
    """The batch was not fully scored before the caller's deadline."""
