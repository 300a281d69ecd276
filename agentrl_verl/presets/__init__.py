"""Hydra presets that extend verl's ``ppo_trainer`` (pass :data:`CONFIG_DIR` as ``--config-path``)."""

from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parent)
