"""The training pipeline that the demo and every bench run, for any Hugging Face model directory.

Three calls, each taking a model directory rather than the tiny model alone:

- :func:`.warmup.warm_up` (planned by :func:`.warmup.plan_warmup`): the families' scripted-expert demonstrations,
  supervised steps on the assistant tokens, the held-out check that stops them, the cache;
- :class:`.launch.RLRun` / :func:`.launch.run_main_ppo`: the one launch of verl's ``main_ppo`` and its supervision
  (its environment, a stall watchdog, a Ray start-up retry, clean-up, the parent-death signal);
- :func:`.evaluation.evaluate_held_out`: held-out play through the stack with the agent loop that trains.

Their settings are :mod:`.settings`; the stack's config and the held-out split are :mod:`.stack`.
"""
