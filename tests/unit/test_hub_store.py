"""A cache folder receiving a model (config/hub_store.py) and what the spreading ranks decide from their table
(engine/spread/plan.py): no MLX, no ranks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from config.hub_cache import Manifest, ManifestFile, repo_folder, snapshot_folder
from config.hub_store import COMPLETE, Incoming, RankStore, items, survey, verify
from engine.spread.plan import Plan

DATA = bytes(range(256)) * 40  # 10240 bytes


def manifest(*files: tuple[str, bytes]) -> Manifest:
    return Manifest("org/x", "main", "d" * 40,
                    tuple(ManifestFile(p, len(b), hashlib.sha256(b).hexdigest()) for p, b in files))


def receive(store: RankStore, item, data: bytes, upto: int | None = None) -> Incoming:
    incoming = Incoming(store, item, store.have(item))
    for pos in range(0, len(data) if upto is None else upto, 1000):
        incoming.write(pos, memoryview(data[pos:pos + 1000]))
    return incoming


def test_a_blob_lands_as_a_link_into_blobs_and_counts_as_held(tmp_path: Path) -> None:
    m = manifest(("sub/w.bin", DATA))
    store = RankStore(tmp_path, m)
    [item] = items(m)
    assert store.have(item) == 0
    assert receive(store, item, DATA).close()
    path = snapshot_folder(tmp_path, "org/x", m.commit) / "sub" / "w.bin"
    assert path.is_symlink() and path.read_bytes() == DATA
    assert os.path.realpath(path) == str(repo_folder(tmp_path, "org/x") / "blobs" / item.sha256)
    assert RankStore(tmp_path, m).have(item) == COMPLETE


def test_a_partial_resumes_from_its_length_and_damaged_bytes_are_dropped(tmp_path: Path) -> None:
    m = manifest(("w.bin", DATA))
    [item] = items(m)
    receive(RankStore(tmp_path, m), item, DATA, upto=3000).file.close()  # a spread killed after 3000 bytes
    store = RankStore(tmp_path, m)
    assert store.have(item) == 3000
    assert receive(store, item, DATA).close()
    bad = bytearray(DATA)
    bad[5000] ^= 1
    other = tmp_path / "other"
    store = RankStore(other, m)
    assert not receive(store, item, bytes(bad)).close()
    assert not store.incomplete(item).exists() and store.have(item) == 0


def test_survey_and_verify_name_what_is_missing_or_damaged(tmp_path: Path) -> None:
    m = manifest(("a.json", b"{}"), ("w.bin", DATA))
    store = RankStore(tmp_path, m)
    a, w = items(m)
    assert receive(store, a, b"{}").close()
    facts = survey(tmp_path, m)
    assert (facts["need"], facts["lacking"]) == (len(DATA), ["w.bin"]) and facts["free"] > 0
    assert receive(store, w, DATA).close()
    blob = repo_folder(tmp_path, "org/x") / "blobs" / w.sha256
    blob.write_bytes(DATA[:-1] + b"\0")  # same size, another byte
    assert verify(tmp_path, m, write=True) == {"bad": ["w.bin"]}
    assert not blob.exists()  # removed, so a copy replaces it


def test_verify_never_deletes_a_file_outside_the_cache_that_a_snapshot_links_to(tmp_path: Path) -> None:
    """A snapshot file may be a link to anywhere (made by hand, or by another tool): wrong bytes there drop the
    link, so a copy replaces it, and leave the linked file alone."""
    m = manifest(("w.bin", DATA))
    cache, mine = tmp_path / "cache", tmp_path / "elsewhere" / "w.bin"
    mine.parent.mkdir()
    mine.write_bytes(b"m" * len(DATA))  # the right size, other bytes
    link = snapshot_folder(cache, "org/x", m.commit) / "w.bin"
    link.parent.mkdir(parents=True)
    link.symlink_to(mine)
    assert verify(cache, m, write=False) == {"bad": ["w.bin"]}
    assert mine.read_bytes() == b"m" * len(DATA)
    assert not link.is_symlink()
    [item] = items(m)
    store = RankStore(cache, m)
    assert receive(store, item, DATA).close() and link.read_bytes() == DATA
    assert mine.read_bytes() == b"m" * len(DATA)


def test_the_plan_refuses_a_rank_without_room_naming_host_and_bytes() -> None:
    m = manifest(("w.bin", DATA))
    table = [[0, 0, 0, COMPLETE], [500, len(DATA), 0, 0]]
    why = Plan(table, items(m)).refusal(m, ["mac-1", "mac-2"], [Path("/c0"), Path("/c1")])
    assert why.startswith("host mac-2 (rank 1) needs 10.2 KB (10240 bytes) in /c1 for org/x but has 500 B (500 "
                          "bytes) free")
    assert Plan([[0, 0, 1, COMPLETE], [10**9, 0, 0, COMPLETE]], items(m)).refusal(m, [], [Path("/c0")] * 2) \
        .startswith("rank 0's cache /c0 lacks 1 of the 1 file(s)")
    ok = Plan([[0, 0, 0, COMPLETE], [10**9, 7000, 0, 3000], [10**9, 0, 0, COMPLETE]], items(m))
    assert ok.refusal(m, [], [Path("/c")] * 3) is None
    assert (ok.needing(0), ok.start(0)) == ([1], 3000)
