"""`./launch.sh check --links`: start every rank through mlx.launch (BACKEND, HOSTFILE or HOSTS, as the engine
starts), meet over the plan channel as the engine does, probe every link, and print each pair's figures.

No model is loaded, so it runs in seconds and says what an engine start would meet first: a rank that cannot
join, a collective that cannot run where the engine puts it, a link that is slow. The ranks are
engine/link_check.py; what they report comes back in rank 0's result file (ipc/link_check.py). A serving JACCL
engine holds the RDMA devices, so with JACCL the check refuses while one runs.
"""

from __future__ import annotations

import os
import socket
import sys

import msgspec

from config import Settings
from ipc.link_check import JOINED, RESULT, LinkCheckResult
from ipc.spread import PARENT_ENV
from ops.download import rank_hosts
from ops.rank_job import JobFailed, RankJob, engine_holds_rdma

RESULT_FILE = "links-result.json"


def link_check(settings: Settings) -> int:
    """0 when every rank met and every link was measured; else 1 after one sentence."""
    hosts = rank_hosts(settings)
    if len(hosts) < 2:
        return _fail(f"one rank ({hosts[0]}) has no links to check: set HOSTS or HOSTFILE to two or more ranks")
    if engine_holds_rdma(settings):
        return _fail("the serving engine holds the Thunderbolt RDMA devices that the check's own JACCL group needs: "
                     "stop it first (./launch.sh stop); while it serves, /health shows the links it probes itself")
    job = RankJob(settings, hosts, "links", "engine.link_check", [], settings.run_dir / RESULT_FILE, JOINED,
                  what="link check", env={PARENT_ENV: f"{socket.gethostname()} {os.getpid()}"})
    try:
        result = RESULT.decode(job.run())
    except JobFailed as exc:
        return _fail(str(exc))
    except msgspec.MsgspecError:
        return _fail(job.why_no_result())
    print(render(result))
    return 0


def render(result: LinkCheckResult) -> str:
    """One line per pair, like the seed projects' RDMA test: who, latency, bandwidth, what the probe cost."""
    lines = [f"links: {result.ranks} ranks over {result.backend} met over the plan channel (a gather, a plan "
             f"broadcast, a plan sent ahead) and probed {len(result.links)} link(s)", ""]
    head = ("pair", "hosts", "latency", "bandwidth", "probe")
    rows = [(f"{link.a}-{link.b}", f"{link.host_a} - {link.host_b}", f"{link.latency_seconds * 1e6:.0f} us",
             f"{link.bandwidth_bytes_per_second / 1e9:.2f} GB/s",
             f"{link.probe_bytes >> 20} MiB in {link.probe_seconds * 1e3:.1f} ms") for link in result.links]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"check --links: {message}", file=sys.stderr, flush=True)
    return 1
