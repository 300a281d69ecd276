"""Benchmarks, run as ``python -m bench.NAME``; the last printed line holds the figures as key=value pairs."""
