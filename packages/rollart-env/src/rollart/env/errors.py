"""Exceptions of rollart.env.

Why a hierarchy: the EnvManager must tell *transient* failures (retry the call) from *crashes*
(restart the environment) from *timeouts*, and none of them may ever be written into the
conversation as if the environment had produced them.
"""

from __future__ import annotations


class EnvError(Exception):
    """Base class of every rollart.env error (also raised by validation with a clear message)."""


class TransientEnvError(EnvError):
    """The call did not take effect and may simply be retried (e.g. a remote env's 503)."""


class EnvCrashedError(EnvError):
    """The environment is unusable; the manager restarts it before the next trajectory."""


class EnvTimeoutError(EnvError):
    """A reset or step did not return within its per-call deadline."""


class EnvProtocolError(EnvError, TypeError):
    """A part handed to the EnvManager does not follow its protocol (a sync `step`, a missing method)."""


class LLMCallError(EnvError):
    """The LLM client failed after its retries; the trajectory ends with a reason."""
