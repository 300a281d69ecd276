"""Fixtures of the sandbox tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def os_image(docker_client) -> str:
    """The tag of the ``os-default`` task image, built here only if missing (``scripts/setup.sh`` builds it)."""
    from env_adapters.sandbox.images import ensure_image

    return ensure_image(docker_client, "os-default")
