"""Streaming the blobs some rank needs, blob by blob in the manifest's order, every rank in step."""

from __future__ import annotations

import time
from pathlib import Path

from config.hub_cache import Manifest
from config.hub_store import Incoming, RankStore
from ipc.spread import SpreadResult
from ops.progress import Progress, human_bytes

from engine.spread.hooks import ChunkHooks
from engine.spread.plan import Plan
from engine.spread.wire import Wire, pick_via, receive_blob, send_blob


class Streamer:
    def __init__(self, wire: Wire, args, store: RankStore, plan: Plan, deadline, stall: float, hooks: ChunkHooks):
        self.wire, self.store, self.plan = wire, store, plan
        self.chunk = args.chunk_bytes
        self.via = pick_via(args.via)
        self.deadline, self.stall, self.hooks = deadline, stall, hooks
        self.bytes_sent = 0
        self.files_sent = 0
        self.seconds = 0.0

    def to_send(self) -> int:
        """Payload bytes rank 0 will put on the wire."""
        total = 0
        for i, b in enumerate(self.plan.blobs):
            if needing := self.plan.needing(i):
                total += (b.size - self.plan.start(i)) * (len(needing) if self.via == "sendrecv" else 1)
        return total

    def progress(self, run_dir: Path, manifest: Manifest, hosts: list[str]) -> Progress:
        ranks = sorted({r for i in range(len(self.plan.blobs)) for r in self.plan.needing(i)})
        names = [hosts[r] if r < len(hosts) else f"rank {r}" for r in ranks]
        return Progress(run_dir, manifest.repo, "spread", self.to_send(), hosts=names)

    def run(self, progress: Progress | None) -> list[int]:
        """Every needed blob moved; the indexes of the blobs this rank received damaged (dropped)."""
        bad: list[int] = []
        began = time.monotonic()
        for i, blob in enumerate(self.plan.blobs):
            needing = self.plan.needing(i)
            if not needing:
                continue
            start = self.plan.start(i)
            self.deadline.beat(f"moving {blob.paths[0]}", self.stall)
            self.files_sent += 1
            if self.wire.rank == 0:
                self._send(i, start, needing, progress)
            elif self.wire.rank in needing:
                if not self._receive(i, start):
                    bad.append(i)
            elif self.via == "allsum":
                receive_blob(self.wire, self.via, start, blob.size, self.chunk, None)
        self.seconds = time.monotonic() - began
        return bad

    def _send(self, i: int, start: int, needing: list[int], progress: Progress | None) -> None:
        blob = self.plan.blobs[i]
        copies = len(needing) if self.via == "sendrecv" else 1
        with open(self.store.snapshot / blob.paths[0], "rb") as f:
            def read(pos: int, n: int) -> bytes:
                f.seek(pos)
                return f.read(n)

            def sent(n: int) -> None:
                self.bytes_sent += n * copies
                self.deadline.beat(f"moving {blob.paths[0]}", self.stall)
                if progress is not None:
                    progress.add(n * copies, blob.paths[0])
                self.hooks.chunk()

            send_blob(self.wire, self.via, start, blob.size, self.chunk, read, needing, sent)

    def _receive(self, i: int, start: int) -> bool:
        blob = self.plan.blobs[i]
        incoming = Incoming(self.store, blob, self.plan.have(self.wire.rank, i))

        def write(pos: int, data: memoryview) -> None:
            incoming.write(pos, data)
            self.deadline.beat(f"moving {blob.paths[0]}", self.stall)
            self.hooks.chunk()

        try:
            receive_blob(self.wire, self.via, start, blob.size, self.chunk, write)
        finally:
            ok = incoming.close()
        return ok

    def result(self, verdicts: list[list[int]], manifest: Manifest, hosts: list[str]) -> SpreadResult:
        """Rank 0's account of the spread, from every rank's [damaged blobs, first damaged index]."""
        common = dict(bytes_sent=self.bytes_sent, files_sent=self.files_sent, seconds=self.seconds, via=self.via)
        for r, (count, first) in enumerate(verdicts):
            if count:
                host = hosts[r] if r < len(hosts) else f"rank {r}"
                path = self.plan.blobs[first].paths[0]
                return SpreadResult(ok=False, message=(
                    f"{path} arrived on host {host} (rank {r}) with another sha256 than the manifest's"
                    + (f" (and {count - 1} more file(s))" if count > 1 else "")
                    + ": its bytes were dropped; run the spread again (if this repeats, rank 0's copy is damaged: "
                    "download the model again)"), **common)
        rate = self.bytes_sent / self.seconds if self.seconds > 0 else 0.0
        moved = (f"{self.files_sent} file(s), {human_bytes(self.bytes_sent)} sent in {self.seconds:.1f} s "
                 f"({human_bytes(rate)}/s over {self.via})" if self.files_sent else "nothing to send")
        return SpreadResult(ok=True, message=f"spread {manifest.repo}: {moved}; every rank holds it, checked by sha256",
                            **common)
