"""Waiting for a version to appear, with a deadline: shared by the channels that hold versions locally."""

from __future__ import annotations

import asyncio

from rollart.sync.errors import SyncTimeoutError, VersionNotAvailableError
from rollart.sync.versioning import LATEST, RetainedVersions, VersionSpec


def pick_version(retained: RetainedVersions, version: VersionSpec) -> int | None:
    """The retained version that satisfies `version`, None if it may still come; raises if it is gone."""
    latest = retained.latest
    if version == LATEST:
        return latest
    if retained.get(version) is not None:
        return version
    if latest is not None and version <= latest:
        raise VersionNotAvailableError(
            f"version {version} is not retained (retained: {list(retained.versions)}); it was evicted or skipped"
        )
    return None


async def wait_for_version(cond: asyncio.Condition, retained: RetainedVersions, version: VersionSpec, timeout: float) -> int:
    """Block on `cond` until `version` is retained; SyncTimeoutError after `timeout` seconds."""
    async with cond:
        try:
            await asyncio.wait_for(cond.wait_for(lambda: pick_version(retained, version) is not None), timeout)
        except TimeoutError as exc:
            raise SyncTimeoutError(
                f"version {version!r} not published within {timeout} s (retained: {list(retained.versions)})"
            ) from exc
        picked = pick_version(retained, version)
    assert picked is not None
    return picked
