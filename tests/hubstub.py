"""A stand-in for the Hugging Face hub on loopback: serves local model folders the way the hub's HTTP API does,
so huggingface_hub (and ops/download.py) fetch from it with HF_ENDPOINT=http://127.0.0.1:PORT.

What it answers (what huggingface_hub 2.x asks; tests/integration/test_download.py runs huggingface_hub's own
snapshot_download against it, tests/unit/test_hubstub_shapes.py pins the shapes to huggingface_hub's docstrings):
    GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]   repo info: sha, siblings (+ size, blobId, lfs)
    GET  /api/models/ORG/NAME/tree/REV[/PATH]?recursive=1   the file listing snapshot_download reads
    POST /api/models/ORG/NAME/paths-info/REV                the same entries for the paths asked (form data)
    HEAD /ORG/NAME/resolve/REV/PATH                         X-Repo-Commit, ETag (a regular file's git blob id)
    GET  /ORG/NAME/resolve/REV/PATH                         a regular file's bytes, with Range (206)
An LFS file (weights; what .gitattributes would name) is, as on the hub, listed with the git blob id of its
POINTER file as blobId and its content's sha256 under lfs; HEAD and GET of it answer 302 to a second loopback
server (the CDN) with the pointer's id as ETag and X-Linked-Etag (the sha256) / X-Linked-Size on the redirect.
The CDN serves the bytes by sha256 with Range, and never needs the token. Errors carry the hub's X-Error-Code
(RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo); the CDN's 404 carries none. No Xet.

For tests it records what it served (bytes per file, each request's host, Range and Authorization headers),
can throttle (bytes/s), can hold every response at a byte offset until released (a test kills a download
half-way without timing guesses), reset a connection once at an offset, send more than it announced, and
answer 404 from the CDN for chosen files.

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
from urllib.parse import parse_qs, quote, unquote, urlsplit

# what a new hub repo's .gitattributes stores in LFS (a subset: the suffixes model repos carry)
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".npz", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ckpt")
LFS_MIN = 10 * 1024 * 1024  # the hub refuses a regular file above this: it must be in LFS
CHUNK = 16 * 1024
_API = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/(revision|tree|paths-info)/([^/]+)(/.*)?)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_CDN = re.compile(r"^/repos/[0-9a-f]{2}/[0-9a-f]{2}/([0-9a-f]{64})$")


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer file git stores for an LFS file (git-lfs spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_id(data: bytes) -> str:
    """git's object id of a blob: sha1 of "blob SIZE\\0" + the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a file's bytes."""
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            sha256.update(block)
            sha1.update(block)
    return sha256.hexdigest(), sha1.hexdigest()


@dataclass
class StubFile:
    path: str
    source: Path
    size: int
    blob_id: str  # git's blob id: of the bytes for a regular file, of the pointer file for an LFS one
    sha256: str
    lfs: bool
    api_size: int  # the size the API announces (a test may make it lie: see HubStub.add)

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.api_size))


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

    bytes: dict[str, int] = field(default_factory=dict)  # file content sent, per file path (hub and CDN)
    # host ("hub" | "cdn"), method, path, file, range, authorization, status
    requests: list[dict] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


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
        self.overflow: dict[str, int] = {}  # path -> bytes sent past the file's end (a hub sending more than it said)
        self.cdn_missing: set[str] = set()  # paths whose CDN object answers 404 (the redirect still happens)
        self._released = threading.Event()
        self._cond = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self, "hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "cdn"))
        for server in (self._server, self._cdn):
            server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        """Another origin (its own port), as the hub's CDN is another host: huggingface_hub drops the token there."""
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add(self, repo: str, folder: Path, tags: tuple[str, ...] = (), token: str | None = None,
            api_sizes: dict[str, int] | None = None, lfs: tuple[str, ...] = ()) -> StubRepo:
        """Serve every file under folder as repo's main branch (and tags); api_sizes lie about sizes; lfs names
        paths stored in LFS beyond the usual suffixes (tokenizer.json is, in some repos)."""
        files = {}
        for p in sorted(q for q in Path(folder).rglob("*") if q.is_file()):
            rel = p.relative_to(folder).as_posix()
            size = p.stat().st_size
            sha256, content_id = _hashes(p)
            in_lfs = p.suffix in LFS_SUFFIXES or size > LFS_MIN or rel in lfs
            api_size = (api_sizes or {}).get(rel, size)
            blob_id = git_blob_id(lfs_pointer(sha256, api_size)) if in_lfs else content_id
            files[rel] = StubFile(rel, p, size, blob_id, sha256, in_lfs, api_size)
        commit = hashlib.sha1("".join(f.path + f.blob_id for f in files.values()).encode()).hexdigest()
        stub = StubRepo(repo, commit, files, {"main": commit, **{t: commit for t in tags}}, token)
        self.repos[repo] = stub
        return stub

    def start(self) -> HubStub:
        for name, server in (("hubstub", self._server), ("hubstub-cdn", self._cdn)):
            # a short poll: stop() waits one poll per server, at every test's teardown
            thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.release()
        for server in (self._server, self._cdn):
            server.shutdown()
            server.server_close()

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

    def requests_on(self, host: str) -> list[dict]:
        return [q for q in self.served.requests if q["host"] == host]

    def _by_sha256(self, sha256: str) -> StubFile | None:
        """The CDN's object store: LFS content by its sha256, whatever repo or path holds it."""
        for stub in self.repos.values():
            for f in stub.files.values():
                if f.lfs and f.sha256 == sha256:
                    return f
        return None

    def _count(self, path: str, n: int) -> None:
        with self._cond:
            self.served.bytes[path] = self.served.bytes.get(path, 0) + n
            self._cond.notify_all()

    def _log(self, entry: dict) -> None:
        with self._cond:
            self.served.requests.append(entry)


def _handler(hub: HubStub, host: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            self._route(head=False, form=parse_qs(body))

        def _route(self, head: bool, form: dict | None = None) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            entry = {"host": host, "method": self.command, "path": path, "file": None,
                     "range": self.headers.get("Range"), "authorization": self.headers.get("Authorization"),
                     "status": 0}
            hub._log(entry)
            try:
                if host == "cdn":
                    self._cdn(path, head, entry)
                elif (m := _API.match(path)) and (m.group(2) == "paths-info") == (form is not None):
                    self._api(m, form if form is not None else parse_qs(url.query), entry)
                elif (m := _RESOLVE.match(path)) and form is None:
                    self._resolve(m, head, entry)
                elif hub.answer_any is not None:
                    self._answer(hub.answer_any, head, entry)
                else:
                    self._error(entry, 404, "EntryNotFound", "no such endpoint")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (killed half-way, or it stopped reading): nothing to answer

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
            found = self._repo(m.group(1), unquote(m.group(3) or "main"), entry)
            if found is None:
                return
            stub, commit = found
            if m.group(2) == "tree":
                body = tree_listing(stub, (m.group(4) or "").strip("/"), _true(query, "recursive"))
            elif m.group(2) == "paths-info":
                asked = set(query.get("paths", []))
                body = [tree_entry(f) for f in stub.files.values() if f.path in asked]
            else:
                body = {"_id": stub.commit, "id": stub.repo, "modelId": stub.repo, "sha": commit,
                        "private": False, "gated": "auto" if stub.token else False, "tags": [],
                        "siblings": [sibling(f, _true(query, "blobs")) for f in stub.files.values()]}
            self._send(entry, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def _resolve(self, m: re.Match, head: bool, entry: dict) -> None:
            found = self._repo(m.group(1), unquote(m.group(2)), entry)
            if found is None:
                return
            stub, commit = found
            f = stub.files.get(m.group(3), hub.answer_any)
            if f is None:
                self._error(entry, 404, "EntryNotFound", f"{m.group(3)} does not exist", commit)
                return
            entry["file"] = f.path
            if not f.lfs:
                self._answer(f, head, entry, {"X-Repo-Commit": commit, "ETag": f'"{f.blob_id}"'})
                return
            # the hub keeps LFS bytes on its CDN: a signed URL there, the content's id and size on the redirect
            where = (f"{hub.cdn_url}/repos/{f.sha256[:2]}/{f.sha256[2:4]}/{f.sha256}"
                     f"?filename={quote(f.path)}&Expires=9999999999&Signature=stub")
            body = f"Found. Redirecting to {where}".encode()
            self._send(entry, 302, body, {"Location": where, "X-Repo-Commit": commit, "ETag": f'"{f.blob_id}"',
                                          "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.api_size),
                                          "Accept-Ranges": "bytes", "Content-Type": "text/plain; charset=utf-8"})

        def _cdn(self, path: str, head: bool, entry: dict) -> None:
            m = _CDN.match(path)
            f = hub._by_sha256(m.group(1)) if m else None
            if f is None or f.path in hub.cdn_missing:
                body = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code></Error>"
                self._send(entry, 404, body, {"Content-Type": "application/xml"})
                return
            entry["file"] = f.path
            self._answer(f, head, entry, {"ETag": f'"{f.sha256}"'})

        def _answer(self, f: StubFile, head: bool, entry: dict, more: dict[str, str] | None = None) -> None:
            length = f.size + hub.overflow.get(f.path, 0)
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **(more or {})}
            start, end = 0, length - 1
            status = 200
            if (rng := self.headers.get("Range")) and not head:
                rm = re.match(r"bytes=(\d+)-(\d*)$", rng)
                if rm is None or int(rm.group(1)) >= length:
                    self._send(entry, 416, b"", headers | {"Content-Range": f"bytes */{length}"})
                    return
                start, end = int(rm.group(1)), min(int(rm.group(2) or length - 1), length - 1)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{length}"
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
                    block = src.read(n) or bytes(n)  # past the file's end: the overflow a test asked for
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


def _true(query: dict, key: str) -> bool:
    return query.get(key, ["false"])[0].lower() in ("true", "1")


def _peer_gone(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def sibling(f: StubFile, blobs: bool) -> dict:
    """One entry of model_info's siblings; with ?blobs=true, size, blobId and lfs as the hub lists them."""
    if not blobs:
        return {"rfilename": f.path}
    out = {"rfilename": f.path, "size": f.api_size, "blobId": f.blob_id}
    if f.lfs:
        out["lfs"] = {"sha256": f.sha256, "size": f.api_size, "pointerSize": f.pointer_size}
    return out


def tree_entry(f: StubFile) -> dict:
    """One file of the tree and paths-info listings (oid: git's blob id, the pointer's for an LFS file)."""
    out = {"type": "file", "oid": f.blob_id, "size": f.api_size, "path": f.path}
    if f.lfs:
        out["lfs"] = {"oid": f.sha256, "size": f.api_size, "pointerSize": f.pointer_size}
    return out


def tree_listing(stub: StubRepo, prefix: str, recursive: bool) -> list[dict]:
    """The folders and files under prefix (all the way down with recursive), as the tree endpoint lists them."""
    base = prefix + "/" if prefix else ""
    entries: dict[str, dict] = {}
    for f in stub.files.values():
        if not f.path.startswith(base):
            continue
        parts = f.path[len(base):].split("/")
        for depth in range(1, len(parts)):
            folder = base + "/".join(parts[:depth])
            if depth == 1 or recursive:
                oid = hashlib.sha1(("tree " + stub.commit + folder).encode()).hexdigest()
                entries.setdefault(folder, {"type": "directory", "oid": oid, "size": 0, "path": folder})
        if len(parts) == 1 or recursive:
            entries[f.path] = tree_entry(f)
    return list(entries.values())


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
    hub.start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
