"""rollart.env: The async Env protocol, trajectory-level EnvManagers, shipped environments, timeouts, retries and redundant rollouts."""

__version__ = "0.1.0"
