import json
import sys

from bench import startup_timeline

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"


def test_every_process_of_the_tree_is_listed_with_its_start_cpu_and_end(tmp_path, capsys):
    # A parent that starts a child burning a second of CPU, then exits with 3.
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BURN!r}])\nsys.exit(3)\n"
    out = tmp_path / "timeline.json"
    args = ["--out", str(out), "--interval", "0.1", "--min-cpu", "0.5", "--", sys.executable, "-c", parent]
    assert startup_timeline.main(args) == 3
    records = json.loads(out.read_text())
    assert len(records) == 2
    parent_record, child = records  # in order of start
    assert child["cpu_s"] >= 0.9 > parent_record["cpu_s"]
    assert 0 <= parent_record["start_s"] <= child["start_s"] < child["end_s"] <= parent_record["end_s"]
    err = capsys.readouterr().err
    assert "process_time" in err and err.strip().splitlines()[-1].startswith("exit_code=3 wall_s=")
