"""Spread a downloaded model from rank 0's cache to every other rank's.

`spread(settings, manifest, hosts)` makes every rank's cache (Settings.hub_cache(rank)) hold the manifest's
files, checked by size and sha256, with the manifest written last. Ranks whose cache is rank 0's own (same
host, same folder) need nothing.

SPREAD_TRANSPORT=cluster starts `python -m engine.spread` on every rank through mlx.launch on the
configured hosts and backend, as the engine is started but on the ports just above the engine's
(RING_PORT..RING_PORT+n-1 stay free for an engine that serves meanwhile). mlx.launch exits 0 whatever its
ranks did, so the verdict is rank 0's result file; a rank that fails makes mlx.launch end the others, and
its exit line and last words make the sentence. SPREAD_TRANSPORT=rsync: ops/spread_rsync.py.

`python -m ops.spread REPO [--revision R]` spreads a model rank 0's cache holds whole (its manifest).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from config import REPO_ROOT, ConfigError, Settings, load_settings
from config.hub_cache import Manifest, read_manifest
from ipc.lifecycle import VICTIM_CAUSES
from ipc.spread import JOINED, PARENT_ENV, decode_result
from ops.failures import describe_exit
from ops.procs import poll
from ops.rank_env import env_args

CHUNK_BYTES = 64 << 20  # per transfer: large enough for the link's full rate, small enough to resume often
LOCAL = {"127.0.0.1", "localhost", "::1"}
PORT_WAIT = 15.0  # seconds for the ports of a spread that just ended (or was killed) to free
LAUNCHER_GRACE = 30.0  # seconds mlx.launch may take to end the other ranks after one failed
RESULT_FILE = "spread-result.json"
_NODE_EXIT = re.compile(r"Node with rank (\d+) (?:was (killed)|exited with code (-?\d+))")
_LAST_WORDS = re.compile(r"^spread rank (\d+): (.*)")


def targets(settings: Settings, hosts: list[str]) -> list[int]:
    """Ranks (in rank order, rank 0 excluded) whose host or cache folder differs from rank 0's."""
    out = []
    for rank in range(1, len(hosts)):
        same_host = hosts[rank] == hosts[0] or {hosts[rank], hosts[0]} <= LOCAL
        if not same_host or settings.hub_cache(rank) != settings.hub_cache(0):
            out.append(rank)
    return out


def spread(settings: Settings, manifest: Manifest, hosts: list[str], *, chunk_bytes: int = CHUNK_BYTES,
           via: str = "auto") -> int:
    """0 when every rank holds the model whole; else 1 after saying why."""
    ranks = targets(settings, hosts)
    if not ranks:
        return 0
    if settings.SPREAD_TRANSPORT == "rsync":
        from ops.spread_rsync import rsync_spread

        return rsync_spread(settings, manifest, hosts, ranks)
    return ClusterSpread(settings, manifest, hosts, chunk_bytes, via).run()


def engine_ports(settings: Settings, hosts: list[str]) -> int:
    """How many ports from RING_PORT the engine's ring takes: one per rank, or per address of a hostfile's host."""
    if not settings.HOSTFILE:
        return len(hosts)
    try:
        path = Path(settings.HOSTFILE).expanduser()
        doc = json.loads((path if path.is_absolute() else REPO_ROOT / path).read_text())
        entries = doc["hosts"] if isinstance(doc, dict) else doc
        return sum(max(1, len(h.get("ips") or [])) for h in entries)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return len(hosts)


def spread_port(settings: Settings, n: int) -> int:
    """The first of the n ports the spread takes: just above the engine's, or when those run out below the
    doorbell's (RING_PORT-1, Settings.doorbell_port)."""
    if settings.RING_PORT + 2 * n - 1 <= 65535:
        return settings.RING_PORT + n
    return settings.doorbell_port - n


def _ports_free(first: int, n: int) -> bool:
    for port in range(first, first + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


@dataclass
class Heard:
    """What the launcher's output told us: ranks that exited, and each rank's last line of its own."""

    exits: dict[int, int | None] = field(default_factory=dict)  # rank -> exit code (None: ended by mlx.launch)
    last_words: dict[int, str] = field(default_factory=dict)
    joined: threading.Event = field(default_factory=threading.Event)


class ClusterSpread:
    def __init__(self, settings: Settings, manifest: Manifest, hosts: list[str], chunk_bytes: int, via: str):
        self.settings, self.manifest, self.hosts = settings, manifest, hosts
        self.chunk_bytes, self.via = chunk_bytes, via
        self.folder = settings.run_dir
        self.result_path = self.folder / RESULT_FILE
        self.heard = Heard()

    def command(self, port: int, manifest_path: Path) -> list[str]:
        s = self.settings
        py = sys.executable
        cmd = [str(Path(py).parent / "mlx.launch"), "--backend", s.BACKEND, "--starting-port", str(port),
               "--cwd", str(REPO_ROOT)]
        cmd += ["--hostfile", s.HOSTFILE] if s.HOSTFILE else ["--hosts", ",".join(self.hosts)]
        # remote ranks do not inherit our environment: forward what was set in it, as the engine's start does
        cmd += env_args(s)
        cmd += ["--env", f"{PARENT_ENV}={socket.gethostname()} {os.getpid()}"]
        return [*cmd, "--", py, "-m", "engine.spread", "--manifest", str(manifest_path), "--result",
                str(self.result_path), "--chunk-bytes", str(self.chunk_bytes), "--via", self.via,
                "--hosts", ",".join(self.hosts)]

    def run(self) -> int:
        n = engine_ports(self.settings, self.hosts)
        port = spread_port(self.settings, n)
        if (self.settings.BACKEND == "ring" and all(h in LOCAL for h in self.hosts)
                and not poll(lambda: _ports_free(port, n), PORT_WAIT, 0.2)):
            return _fail(f"ports {port} to {port + n - 1} on this host stay in use, and the spread's {n} local "
                         "ranks need them (the engine's are RING_PORT and up, the spread's just above): stop what "
                         "uses them or set RING_PORT to another free range")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.result_path.unlink(missing_ok=True)
        manifest_path = self.folder / f"spread-manifest-{self.manifest.commit}.json"
        manifest_path.write_text(self.manifest.to_json())
        popen = subprocess.Popen(self.command(port, manifest_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        relay = threading.Thread(target=self.relay, args=(popen,), name="spread-relay", daemon=True)
        relay.start()
        try:
            self.wait(popen)
        finally:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
            relay.join(timeout=5)
            for pipe in (popen.stdin, popen.stdout):
                if pipe is not None:
                    pipe.close()
            manifest_path.unlink(missing_ok=True)
        return self.verdict()

    def relay(self, popen: subprocess.Popen) -> None:
        """The ranks' output to ours; once every rank joined, one byte quiets mlx.launch's stdin loop
        (the workaround the engine's supervisor applies: ranks point fd 0 at /dev/null first)."""
        assert popen.stdout is not None and popen.stdin is not None
        for raw in iter(popen.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            print(line, file=sys.stderr, flush=True)
            if m := _NODE_EXIT.search(line):
                self.heard.exits[int(m.group(1))] = None if m.group(2) else int(m.group(3))
            elif m := _LAST_WORDS.match(line):
                self.heard.last_words[int(m.group(1))] = m.group(2)
            elif line.strip() == JOINED and not self.heard.joined.is_set():
                self.heard.joined.set()
                try:
                    popen.stdin.write(b"x")
                    popen.stdin.flush()
                except OSError:
                    pass

    def wait(self, popen: subprocess.Popen) -> None:
        """Until mlx.launch exits: the ranks bound their own waits; once one failed, mlx.launch gets
        LAUNCHER_GRACE to end the others before it is killed."""
        failed_at = None
        while popen.poll() is None:
            if failed_at is None and any(code != 0 for code in self.heard.exits.values()):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > LAUNCHER_GRACE:
                return
            time.sleep(0.2)

    def verdict(self) -> int:
        try:
            result = decode_result(self.result_path.read_bytes())
        except (OSError, msgspec.MsgspecError):
            return _fail(self.why_no_result())
        if not result.ok:
            return _fail(result.message)
        print(f"spread: bytes_sent={result.bytes_sent} files_sent={result.files_sent}")
        return 0

    def why_no_result(self) -> str:
        """The sentence for a spread that ended without rank 0's result: the rank that failed first, in its
        own words (a rank that ended because another one did, or that mlx.launch ended, is not the culprit)."""
        failed = {r: code for r, code in self.heard.exits.items() if code != 0}
        if not failed:
            return "the spread ended without a result from rank 0 (its output is above)"
        culprits = [r for r in sorted(failed) if failed[r] is not None and failed[r] not in VICTIM_CAUSES]
        r = (culprits or sorted(failed))[0]
        host = self.hosts[r] if r < len(self.hosts) else "?"
        words = self.heard.last_words.get(r)
        return f"the spread failed: rank {r} ({host}) {describe_exit(failed[r])}" + (f": {words}" if words else "")


def _fail(message: str) -> int:
    print(f"spread: {message}", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.spread", description="Spread a model rank 0's cache holds "
                                "whole to every rank's cache.")
    p.add_argument("repo")
    p.add_argument("--revision", default="main")
    p.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES)
    p.add_argument("--via", choices=("auto", "sendrecv", "allsum"), default="auto",
                   help="cluster transport: send/recv (two ranks), all_sum (any number); auto picks")
    args = p.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        return _fail(f"configuration error: {exc}")
    if settings.HOSTFILE:
        from ops.cluster import cluster_hosts

        merged = cluster_hosts(settings)[0]
        hosts = [""] * sum(len(h.ranks) for h in merged)
        for h in merged:
            for r in h.ranks:
                hosts[r] = h.name
    else:
        hosts = settings.hosts
    manifest = read_manifest(settings.hub_cache(0), args.repo, args.revision)
    if manifest is None:
        return _fail(f"rank 0's cache {settings.hub_cache(0)} holds no whole copy of {args.repo} at {args.revision} "
                     "(no manifest): download it first")
    return spread(settings, manifest, hosts, chunk_bytes=args.chunk_bytes, via=args.via)


if __name__ == "__main__":
    sys.exit(main())
