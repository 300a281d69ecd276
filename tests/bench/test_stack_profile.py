"""bench.stack_profile: py-spy's raw stacks per process, and the frames' shares."""

from bench.stack_profile import parse, report

RAW = """process 10:"python -m agentrl_verl.tools.cli demo";main (cli.py:1);warm_up (demo.py:2) 30
process 10:"python -m agentrl_verl.tools.cli demo";main (cli.py:1);evaluate (demo.py:3) 10
process 10:"python -m agentrl_verl.tools.cli demo";process 22:"ray::WorkerDict
 --flag";run (worker.py:1);Worker.update_actor (engine.py:7);logprobs (tf.py:9) 6
process 10:"python -m agentrl_verl.tools.cli demo";process 22:"ray::WorkerDict
 --flag";run (worker.py:1);Worker.update_actor (engine.py:7);step (optim.py:2) 2
process 10:"python -m agentrl_verl.tools.cli demo";process 22:"ray::WorkerDict
 --flag";run (worker.py:1);idle (worker.py:5) 8
"""


def test_stacks_are_counted_per_process_under_the_last_process_frame():
    processes = parse(RAW)
    assert {pid: (p.command, p.samples) for pid, p in processes.items()} == {
        10: ("python -m agentrl_verl.tools.cli demo", 40), 22: ("ray::WorkerDict --flag", 16)}
    counted, shares = processes[10].frame_shares()
    assert counted == 40 and shares[0] == ("main (cli.py:1)", 1.0) and ("warm_up (demo.py:2)", 0.75) in shares


def test_within_counts_the_samples_of_a_function_named_qualified_or_not():
    worker = parse(RAW)[22]
    for name in ("update_actor", "Worker.update_actor"):
        counted, shares = worker.frame_shares(name)
        assert counted == 8 and dict(shares)["logprobs (tf.py:9)"] == 0.75
    assert worker.frame_shares("pdate_actor")[0] == 0  # a part of a name, not a name
    text = report(parse(RAW), top=2, within="update_actor", min_samples=1)
    assert "## pid 22: ray::WorkerDict --flag\n8 samples with update_actor on the stack" in text
    assert "pid 10" not in text
