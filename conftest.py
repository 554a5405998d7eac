"""Session-wide test fixtures shared by every package's tests.

Ray is started once per test session (it takes seconds and ~0.7 GB), on 127.0.0.1 only, with
logical GPUs and one custom resource per hardware type so placement by hardware is real.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# Keep every Ray socket on loopback: together with `_node_ip_address` this stops Ray from
# binding the machine's external address (verified: all listeners on 127.0.0.1).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

RAY_NUM_GPUS = 8
RAY_RESOURCES = {"H800": 4.0, "H20": 4.0}


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster: 8 logical GPUs (4 tagged H800, 4 tagged H20), bound to 127.0.0.1."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            num_cpus=8,
            num_gpus=RAY_NUM_GPUS,
            resources=RAY_RESOURCES,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            namespace="rollart-tests",
        )
    yield ray
    ray.shutdown()
