"""A stand-in for the Hugging Face hub on loopback: serves local model folders the way the hub's HTTP API does,
so huggingface_hub (and ops/download.py) fetch from it with HF_ENDPOINT=http://127.0.0.1:PORT.

What it answers (what huggingface_hub 2.x asks):
    GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]   repo info: sha, siblings (+ size, blobId, lfs)
    GET  /api/models/ORG/NAME/tree/REV[/PATH]?recursive=1   the file listing snapshot_download reads
    HEAD /ORG/NAME/resolve/REV/PATH                         X-Repo-Commit, ETag, X-Linked-Etag/-Size (LFS)
    GET  /ORG/NAME/resolve/REV/PATH                         the bytes, with Range (206) for a resumed download
Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo), which
huggingface_hub turns into its own exception classes. No Xet: every file is plain HTTP.

For tests it records what it served (bytes per file, Range and Authorization headers), can throttle
(bytes/s) and can hold every response at a byte offset until released, so a test can kill a download
half-way without timing guesses.

    python -m tests.hubstub --port 8999 org/tiny=/path/to/folder [--rate 1000000] [--token hf_x]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".npz", ".pt", ".pth", ".h5", ".msgpack")
LFS_MIN = 10 * 1024 * 1024  # the hub stores any file above this in LFS, whatever its name
CHUNK = 16 * 1024
_API = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/(revision|tree)/([^/]+)(/.*)?)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@dataclass
class StubFile:
    path: str
    source: Path
    size: int
    oid: str  # the git blob id (sha1 of "blob SIZE\0" + bytes): the hub's ETag of a non-LFS file
    sha256: str
    lfs: bool
    api_size: int  # the size the API announces (a test may make it lie: see HubStub.add)


@dataclass
class StubRepo:
    repo: str
    commit: str
    files: dict[str, StubFile]
    refs: dict[str, str]  # branch or tag -> commit
    token: str | None = None  # set: the repo is gated and only this bearer token reads it


@dataclass
class Served:
    """What the stub sent, for tests to assert on."""

    bytes: dict[str, int] = field(default_factory=dict)  # per file path
    requests: list[dict] = field(default_factory=list)  # method, path, range, authorization, status

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def git_blob_oid(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class HubStub:
    """The server; `with HubStub() as hub: hub.add("org/tiny", folder)`, then HF_ENDPOINT=hub.url."""

    def __init__(self, port: int = 0, rate: float = 0.0):
        self.repos: dict[str, StubRepo] = {}
        self.served = Served()
        self.rate = rate  # bytes per second per response; 0: as fast as the socket goes
        self.hold_at: int | None = None  # every response stops at this offset of its file until release()
        # a broken or hostile mirror: a file path no repo knows is answered with this file's bytes
        self.answer_any: StubFile | None = None
        self.cut_at: int | None = None  # the next response to reach this offset of its file is reset there (once)
        self._released = threading.Event()
        self._cond = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo: str, folder: Path, tags: tuple[str, ...] = (), token: str | None = None,
            api_sizes: dict[str, int] | None = None) -> StubRepo:
        """Serve every file under folder as repo's main branch (and tags); api_sizes lie about sizes."""
        files = {}
        for p in sorted(q for q in Path(folder).rglob("*") if q.is_file()):
            rel = p.relative_to(folder).as_posix()
            size = p.stat().st_size
            files[rel] = StubFile(rel, p, size, git_blob_oid(p), _sha256(p),
                                  p.suffix in LFS_SUFFIXES or size > LFS_MIN, (api_sizes or {}).get(rel, size))
        commit = hashlib.sha1("".join(f.path + f.oid for f in files.values()).encode()).hexdigest()
        stub = StubRepo(repo, commit, files, {"main": commit, **{t: commit for t in tags}}, token)
        self.repos[repo] = stub
        return stub

    def start(self) -> HubStub:
        self._thread = threading.Thread(target=self._server.serve_forever, name="hubstub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HubStub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def reset(self) -> None:
        with self._cond:
            self.served = Served()

    def hold(self, offset: int) -> None:
        """From now on every file's bytes stop at this offset until release()."""
        self._released.clear()
        self.hold_at = offset

    def release(self) -> None:
        self.hold_at = None
        self._released.set()

    def wait_served(self, nbytes: int, path: str | None = None, timeout: float = 30.0) -> int:
        """Block until the stub has sent at least nbytes of file content (of one file, or in all)."""
        deadline = time.monotonic() + timeout

        def count() -> int:
            return self.served.bytes.get(path, 0) if path else self.served.total

        with self._cond:
            while count() < nbytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the hub stub served {count()} bytes, not {nbytes}, in {timeout}s")
                self._cond.wait(left)
            return count()

    def _count(self, path: str, n: int) -> None:
        with self._cond:
            self.served.bytes[path] = self.served.bytes.get(path, 0) + n
            self._cond.notify_all()

    def _log(self, entry: dict) -> None:
        with self._cond:
            self.served.requests.append(entry)


def _handler(hub: HubStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            entry = {"method": self.command, "path": path, "range": self.headers.get("Range"),
                     "authorization": self.headers.get("Authorization"), "status": 0}
            hub._log(entry)
            try:
                if m := _API.match(path):
                    self._api(m, parse_qs(url.query), entry)
                elif m := _RESOLVE.match(path):
                    self._resolve(m, head, entry)
                elif hub.answer_any is not None:
                    self._answer(hub.answer_any, head, entry)
                else:
                    self._error(entry, 404, "EntryNotFound", "no such endpoint")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (killed half-way): nothing to answer

        def _repo(self, repo: str, rev: str, entry: dict) -> tuple[StubRepo, str] | None:
            stub = hub.repos.get(repo)
            if stub is None:
                self._error(entry, 404, "RepoNotFound", "Repository not found")
                return None
            if stub.token is not None:
                auth = self.headers.get("Authorization")
                if auth is None:
                    self._error(entry, 401, "GatedRepo", "Access to this gated repo is restricted")
                    return None
                if auth != f"Bearer {stub.token}":
                    self._error(entry, 401, None, "Invalid credentials in Authorization header")
                    return None
            commit = stub.refs.get(rev, rev if rev == stub.commit else None)
            if commit is None:
                self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return stub, commit

        def _api(self, m: re.Match, query: dict, entry: dict) -> None:
            found = self._repo(m.group(1), m.group(3) or "main", entry)
            if found is None:
                return
            stub, commit = found
            if m.group(2) == "tree":
                prefix = (m.group(4) or "").strip("/")
                body = [_tree_entry(f) for f in stub.files.values()
                        if not prefix or f.path.startswith(prefix + "/")]
            else:
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                body = {"_id": stub.commit, "id": stub.repo, "modelId": stub.repo, "sha": commit,
                        "private": False, "gated": "auto" if stub.token else False, "tags": [],
                        "siblings": [_sibling(f, blobs) for f in stub.files.values()]}
            self._send(entry, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def _resolve(self, m: re.Match, head: bool, entry: dict) -> None:
            found = self._repo(m.group(1), m.group(2), entry)
            if found is None:
                return
            stub, commit = found
            f = stub.files.get(m.group(3), hub.answer_any)
            if f is None:
                self._error(entry, 404, "EntryNotFound", f"{m.group(3)} does not exist", commit)
                return
            self._answer(f, head, entry, {"X-Repo-Commit": commit})

        def _answer(self, f: StubFile, head: bool, entry: dict, more: dict[str, str] | None = None) -> None:
            etag = f.sha256 if f.lfs else f.oid
            headers = {**(more or {}), "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if f.lfs:
                headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(f.api_size)}
            start, end = 0, f.size - 1
            status = 200
            if (rng := self.headers.get("Range")) and not head:
                rm = re.match(r"bytes=(\d+)-(\d*)$", rng)
                if rm is None or int(rm.group(1)) >= f.size:
                    self._send(entry, 416, b"", headers | {"Content-Range": f"bytes */{f.size}"})
                    return
                start, end = int(rm.group(1)), min(int(rm.group(2) or f.size - 1), f.size - 1)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
            headers["Content-Length"] = str(end - start + 1)
            entry["status"] = status
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self._stream(f, start, end + 1)

        def _stream(self, f: StubFile, start: int, stop: int) -> None:
            began = time.monotonic()
            sent = 0
            with open(f.source, "rb") as src:
                src.seek(start)
                pos = start
                while pos < stop:
                    hold = hub.hold_at
                    if hold is not None and pos >= hold:
                        hub._released.wait()
                        if _peer_gone(self.connection):
                            return  # its client was killed while held: what it never got must not count
                    if self._cut(pos):
                        return
                    n = min(CHUNK, stop - pos, (hold - pos) if hold is not None and pos < hold else CHUNK,
                            (hub.cut_at - pos) if hub.cut_at is not None and pos < hub.cut_at else CHUNK)
                    block = src.read(n)
                    self.wfile.write(block)
                    self.wfile.flush()
                    pos += len(block)
                    sent += len(block)
                    hub._count(f.path, len(block))
                    if hub.rate:
                        ahead = sent / hub.rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)

        def _cut(self, pos: int) -> bool:
            """At the cut offset: reset the connection (RST, as a dropped link or a NAT timeout does), once."""
            with hub._cond:
                if hub.cut_at is None or pos < hub.cut_at:
                    return False
                hub.cut_at = None
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return True

        def _error(self, entry: dict, status: int, code: str | None, message: str, commit: str | None = None) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(entry, status, json.dumps({"error": message}).encode(), headers)

        def _send(self, entry: dict, status: int, body: bytes, headers: dict[str, str]) -> None:
            entry["status"] = status
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def _peer_gone(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _lfs(f: StubFile) -> dict:
    return {"oid": f.sha256, "sha256": f.sha256, "size": f.api_size, "pointerSize": 134}


def _sibling(f: StubFile, blobs: bool) -> dict:
    if not blobs:
        return {"rfilename": f.path}
    out = {"rfilename": f.path, "size": f.api_size, "blobId": f.oid}
    if f.lfs:
        out["lfs"] = _lfs(f)
    return out


def _tree_entry(f: StubFile) -> dict:
    out = {"type": "file", "path": f.path, "size": f.api_size, "oid": f.oid}
    if f.lfs:
        out["lfs"] = _lfs(f)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.hubstub", description=__doc__.splitlines()[0])
    p.add_argument("repos", nargs="+", metavar="ORG/NAME=FOLDER")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rate", type=float, default=0.0, help="bytes per second per response (default: unthrottled)")
    p.add_argument("--token", help="make every repo gated: only this HF_TOKEN reads it")
    args = p.parse_args(argv)
    hub = HubStub(args.port, args.rate)
    for spec in args.repos:
        repo, sep, folder = spec.partition("=")
        if not sep or not Path(folder).is_dir():
            p.error(f"{spec!r} is not ORG/NAME=FOLDER with an existing folder")
        stub = hub.add(repo, Path(folder), token=args.token)
        print(f"{repo}: {len(stub.files)} files, commit {stub.commit}", flush=True)
    print(f"HF_ENDPOINT={hub.url}", flush=True)
    try:
        hub._server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
