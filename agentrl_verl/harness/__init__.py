"""The demo that runs AgentRL end to end on a CPU machine with no downloads.

The tiny offline model (:mod:`.tiny_model`), the supervised cold start (:mod:`.cold_start`) and its cached warm-up
(:mod:`.warmup_cache`), the demo runner (:mod:`.demo`) and the Hydra presets it trains with (:mod:`.presets`).
"""
