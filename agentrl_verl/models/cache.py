"""Where built models are kept, and how a directory is built so that a reader sees it whole or not at all."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE_DIR`` or ``~/.cache/agentrl_verl``."""
    return Path(os.environ.get("AGENTRL_CACHE_DIR", Path.home() / ".cache" / "agentrl_verl"))


def build_directory(target: Path, build: Callable[[Path], None], complete: str = "config.json") -> None:
    """Run ``build`` into a temporary directory beside ``target`` and rename it to ``target`` once it returns: a reader
    (another process, a verl run waiting for its start model) sees the directory whole or not at all.

    Raises:
        OSError: ``target`` could not be put in place (it exists, and holds no ``complete`` file: no finished build).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / complete).exists():
                raise
            # Another process built the same thing meanwhile, from the same inputs: either copy will do.
            logger.info("%s was built meanwhile; using it", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
