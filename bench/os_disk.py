"""A command that writes far past the ``os`` task's disk limit: where it stops, how long it takes, what the agent sees.

One session of the ``os`` task (the Docker daemon that ``DOCKER_HOST`` names, else the local one) runs
``dd`` asking for ``--write-mib`` MiB in ``/root``, then ``du``; the session is then closed (its container
removed). Usage::

    python -m bench.os_disk [--disk 2g] [--write-mib 5120]

Results and how to read them: ``docs/environments/os.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from env_adapters.task import assistant_tool_call
from env_adapters.tasks.os_interaction import OSTask


async def measure(disk: str, write_mib: int) -> dict[str, object]:
    task = OSTask(split="dev", pool_size=0, reap_interval=0, disk=disk, command_timeout=300.0, output_limit=4000)
    await task.setup()
    try:
        session = await task.start_session(6)
        await session.reset()
        script = f"dd if=/dev/zero of=/root/big bs=1M count={write_mib} 2>&1 | grep -v records; du -m /root/big"
        t0 = time.monotonic()
        result = await session.step(assistant_tool_call("bash_action", {"script": script}))
        seconds = time.monotonic() - t0
        reply = result.messages[0]["content"]
        t1 = time.monotonic()
        await session.close()
        return {"bounded": task.pool.disk_bounded, "status": result.status.value, "reply": reply,
                "written_mib": int(reply.split()[-2]), "seconds": seconds, "close_seconds": time.monotonic() - t1}
    finally:
        await task.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disk", default="2g", help="the task's disk option (Docker units)")
    parser.add_argument("--write-mib", type=int, default=5120, help="MiB the command asks to write")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    out = asyncio.run(measure(args.disk, args.write_mib))
    print(f"what the agent saw ({out['status']}):\n{out['reply']}")
    print(f"disk={args.disk} asked_mib={args.write_mib} daemon_bounds={out['bounded']} "
          f"written_mib={out['written_mib']} command_s={out['seconds']:.1f} close_s={out['close_seconds']:.1f}")


if __name__ == "__main__":
    main()
