"""Warm-up models kept between runs, keyed by everything that shapes them.

A supervised warm-up (:mod:`.cold_start`) gives the same model for the same settings every time, and takes minutes.
:func:`cached_warmup` builds it once under a key made of those settings and of the warm-up code
(:func:`cache_key`), in a temporary directory renamed into place (:func:`build_whole`), with a ``warmup.json`` of
what the warm-up did (steps, held-out success, history) so that a later run that reuses the model can still report
it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_verl.models.cache import build_directory

logger = logging.getLogger(__name__)

METADATA = "warmup.json"
"""The file in a cached model's directory that holds what its warm-up did."""


def cache_key(settings: dict[str, Any]) -> str:
    """Cache key of a warm-up model: a hash of ``settings`` (JSON values: everything that shapes the model) and of
    the warm-up code (:mod:`.cold_start`), so that a change to either builds another model."""
    from agentrl_verl.pipeline import cold_start

    code = hashlib.sha256(Path(cold_start.__file__).read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps({**settings, "code": code}, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class CachedWarmup:
    """A cached warm-up model: its directory, what its warm-up did, and whether an earlier run built it."""

    path: Path
    metadata: dict[str, Any]
    """What the build returned (written to :data:`METADATA`); empty for a model cached before it was kept."""
    reused: bool


def cache_path(root: Path, name: str, settings: dict[str, Any]) -> Path:
    """Where :func:`cached_warmup` keeps the model of ``settings``: ``root/<name>-<key>``."""
    return root / f"{name}-{cache_key(settings)}"


def build_whole(target: Path, build: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Run ``build`` into a directory that appears at ``target`` whole, with :data:`METADATA`
    (:func:`~agentrl_verl.models.cache.build_directory`): a reader (a verl run waiting for its start model) sees the
    model whole or not at all.

    Returns:
        What ``build`` returned. A build that raises (or is interrupted) leaves nothing at ``target``.

    Raises:
        OSError: ``target`` could not be put in place (it exists, and is no complete model).
    """
    done: dict[str, Any] = {}

    def build_with_metadata(directory: Path) -> None:
        done.update(build(directory))
        (directory / METADATA).write_text(json.dumps(done))

    build_directory(target, build_with_metadata)
    if not done:  # another process built it meanwhile: its metadata is what there is
        done.update(json.loads((target / METADATA).read_text()))
    return done


def cached_warmup(root: Path, name: str, settings: dict[str, Any],
                  build: Callable[[Path], dict[str, Any]]) -> CachedWarmup:
    """The warm-up model of ``settings`` under ``root``, built by ``build`` unless an earlier run left it there.

    Args:
        root: Where the models are kept (e.g. ``$AGENTRL_CACHE_DIR/<bench>``).
        name: The directory's prefix, before the key (``<name>-<key>``, :func:`cache_path`).
        settings: Everything that shapes the model, JSON values (see :func:`cache_key`).
        build: Writes the model (an HF directory) into the empty directory it is given and returns what the warm-up
            did (JSON values), kept in :data:`METADATA`.

    Returns:
        The model's directory, its metadata and whether it was reused. A build that raises (or is interrupted)
        leaves nothing under the key (:func:`build_whole`).
    """
    target = cache_path(root, name, settings)
    if (target / "config.json").exists():
        logger.info("warm-up: reusing the cached model %s", target)
        metadata = target / METADATA
        return CachedWarmup(target, json.loads(metadata.read_text()) if metadata.exists() else {}, True)
    logger.info("warm-up: building the model (once; cached in %s)", target)
    return CachedWarmup(target, build_whole(target, build), False)
