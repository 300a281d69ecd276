"""User tools of the training side: datasets (:mod:`.data`), evaluation with a pool of endpoints
(:mod:`.evaluate`), paired before/after statistics (:mod:`.compare`) and the ``agentrl-verl`` command (:mod:`.cli`).
"""
