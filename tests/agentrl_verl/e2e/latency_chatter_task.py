"""``latency_chatter``: the ``chatter`` test task with an environment delay per step (``step_latency``, as ``calc``).

Multi-turn for any model and slow on the environment side, so episodes of the asynchronous pipeline outlive
weight updates. Loaded by the env worker as ``latency_chatter_task:LatencyChatterTask`` (this folder on
``PYTHONPATH``).
"""

from __future__ import annotations

import random
from typing import Any

from chatter_task import ChatterTask

from env_adapters.tasks.calculator import step_latency_sampler


class LatencyChatterTask(ChatterTask):
    def __init__(self, step_latency: dict[str, Any] | None = None, seed: int = 0, **config: Any) -> None:
        super().__init__(**config)
        self.latency = step_latency_sampler(step_latency, random.Random(seed))
