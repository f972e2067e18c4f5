"""HELPER_RANK=k without MLX: rank 0's forwarder (engine/rank0/helper_remote.py) against rank k's real listener
(engine/helpers/rank_server.py, its desk and inbox, a thread standing in for rank k's step loop), and against fake
peers on the same wire for what a real rank k does only when it breaks: gone, dropping a request, too slow. Every
failure is an answer (503 or 504) naming what happened, never a hang."""

from __future__ import annotations

import select
import socket
import threading

import anyio
import numpy as np
import pytest

from engine.helpers.inbox import HelperInbox
from engine.helpers.link import Address, HelperLinkError, read, row
from engine.helpers.rank_server import HelperRankServer
from engine.helpers.work import HelperWork
from engine.rank0.helper_desk import HelperDesk
from engine.rank0.helper_remote import RemoteHelpers
from ipc import PROTOCOL_VERSION, Embed, Embedded, Error, FramedStream, HelperHello, HelperState, HelperWelcome, Rerank
from tests.unit.test_helper_work import FakeEmbedder

STATE = HelperState(kind="embedding", name="fake", rank=1, max_tokens=8, dimensions=4, weight_bytes=1234)


class Loaded:
    """What engine/helpers/load.py gives the desk: the helper and its state."""

    def __init__(self, helper):
        self.helper = helper

    def state(self, rank: int) -> HelperState:
        return STATE


class RankK:
    """Rank k's side for real: its listener, its desk and inbox, and a thread running the inbox's slices as its
    step loop does while asleep (woken by the inbox, not by polling)."""

    def __init__(self, compute: bool = True, max_frame: int = 1 << 20, timeout: float = 30.0):
        self.helper = FakeEmbedder()
        self.inbox = HelperInbox(HelperWork(budget=8))
        self.queued = threading.Event()
        put = self.inbox.put
        self.inbox.put = lambda job: (put(job), self.queued.set())
        desk = HelperDesk({"embedding": Loaded(self.helper)}, self.inbox, max_inputs=64, timeout=timeout)
        self.server = HelperRankServer(desk, [STATE], token=12345, max_frame=max_frame)
        self.port = self.server.listen("127.0.0.1")
        self.stopping = threading.Event()
        self.loop = threading.Thread(target=self._steps, daemon=True)
        if compute:
            self.loop.start()

    def _steps(self) -> None:
        while not self.stopping.is_set():
            if self.inbox.pending():
                self.inbox.run_slice()
            else:
                select.select([self.inbox.fileno()], [], [], 0.2)

    def remote(self, token: int = 12345, **kw) -> RemoteHelpers:
        return RemoteHelpers(Address("127.0.0.1", self.port, token), 1, kw.pop("timeout", 30.0), 1 << 20, **kw)

    def close(self) -> None:
        self.stopping.set()
        self.server.stop()
        if self.loop.is_alive():
            self.loop.join(5)
        self.inbox.close()


@pytest.fixture
def rank_k():
    k = RankK()
    yield k
    k.close()


async def never_leaves(conn, rid, scope, complaint) -> None:
    await anyio.sleep_forever()


def ask(remote: RemoteHelpers, msg, watch=never_leaves) -> list:
    async def go():
        with anyio.fail_after(30):  # a hang fails the test instead of stalling it
            return await remote.answer(None, msg, None, watch)
    return anyio.run(go)


def test_the_link_row_carries_the_address_and_token_every_rank_gathers():
    address = Address("fe80::1%en0", 40123, (1 << 62) - 3)
    assert read(row(address)) == address and read(row(None)) is None


def test_rank0_relays_rank_ks_embeddings_frame_by_frame_and_its_refusals():
    k = RankK(max_frame=1000)  # a small frame limit: the answer spans several Embedded frames
    try:
        remote = k.remote()
        assert remote.welcome() == [STATE]  # what /v1/models, /health and the rank's helper_bytes show
        texts = [" ".join("w" * (1 + i % 5) for _ in range(1 + i % 6)) for i in range(40)]
        frames = ask(remote, Embed(request_id="r1", inputs=texts))
        assert len(frames) > 1 and all(isinstance(f, Embedded) for f in frames)
        assert [f.more for f in frames] == [True] * (len(frames) - 1) + [False]
        rows = np.stack([np.frombuffer(e, "<f4") for f in frames for e in f.embeddings])
        want = k.helper.embed([k.helper.tokenize(t) for t in texts])
        assert np.array_equal(rows, want) and frames[0].prompt_tokens == sum(len(k.helper.tokenize(t)) for t in texts)
        # rank k's checks answer as rank 0's would: the client's 400 naming the input, relayed unchanged
        (refused,) = ask(remote, Embed(request_id="r2", inputs=["ok", ""]))
        assert isinstance(refused, Error) and refused.status == 400 and refused.param == "input[1]"
        # a kind rank k does not serve is rank 0's own 404 naming the setting
        (missing,) = ask(remote, Rerank(request_id="r3", query="q", documents=["d"]))
        assert missing.status == 404 and "RERANK_MODEL" in missing.message
    finally:
        k.close()


def test_a_rank_k_that_is_gone_is_a_503_naming_it_and_refuses_the_start():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: nothing listens there any more
    remote = RemoteHelpers(Address("127.0.0.1", port, 1), 1, 30.0, 1 << 20, states=[STATE])
    (err,) = ask(remote, Embed(request_id="r", inputs=["a"]))
    assert err.status == 503 and err.code == "helper_rank_unavailable" and "rank 1 (HELPER_RANK)" in err.message
    with pytest.raises(HelperLinkError, match="cannot reach rank 1's helper listener.*HELPER_RANK=0"):
        remote.welcome()


def test_a_stranger_without_the_token_is_dropped_and_rank_k_serves_on(rank_k):
    with pytest.raises(HelperLinkError):
        rank_k.remote(token=999).welcome()
    assert rank_k.remote().welcome() == [STATE]


async def fake_rank_k(behaviour, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """A peer on the real wire that welcomes rank 0, takes its request, then does what behaviour does."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def one(stream) -> None:
        conn = FramedStream(stream, 1 << 20)
        async with stream:
            assert isinstance(await conn.recv(), HelperHello)
            await conn.send(HelperWelcome(version=PROTOCOL_VERSION, helpers=[STATE]))
            await behaviour(conn, await conn.recv())

    async with listener:
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await listener.serve(one)


def against_fake(behaviour, **kw) -> list:
    async def go():
        async with anyio.create_task_group() as tg:
            port = await tg.start(fake_rank_k, behaviour)
            remote = RemoteHelpers(Address("127.0.0.1", port, 1), 1, kw.get("timeout", 30.0), 1 << 20, states=[STATE])
            remote.grace = 0.0
            with anyio.fail_after(30):
                frames = await remote.answer(None, Embed(request_id="r", inputs=["a", "b"]), None, never_leaves)
            tg.cancel_scope.cancel()
        return frames
    return anyio.run(go)


def test_a_rank_k_lost_mid_request_is_a_503_and_a_silent_one_a_504():
    async def half_answer_then_die(conn, msg):
        await conn.send(Embedded(request_id=msg.request_id, embeddings=[b"\0" * 16], prompt_tokens=2, dimensions=4,
                                 more=True))

    async def silent(conn, msg):
        await anyio.sleep_forever()

    (lost,) = against_fake(half_answer_then_die)
    assert lost.status == 503 and "lost this request" in lost.message
    (slow,) = against_fake(silent, timeout=0.2)
    assert slow.status == 504 and slow.code == "request_timeout"


def test_a_client_that_leaves_takes_its_queued_work_off_rank_k():
    k = RankK(compute=False)  # rank k busy elsewhere: the job waits in its queue
    try:
        async def leaves_once_queued(conn, rid, scope, complaint):
            await anyio.to_thread.run_sync(k.queued.wait, 10)
            scope.cancel()

        assert ask(k.remote(states=[STATE]), Embed(request_id="r", inputs=["a"]), leaves_once_queued) == []
        job = k.inbox._queue.get(timeout=10)
        assert job.cancelled.wait(10)  # rank k saw the connection close: none of its slices will be computed
    finally:
        k.close()


def test_check_refuses_a_helper_rank_the_engine_lacks_in_one_sentence(tmp_path):
    from config import ConfigError, load_settings

    env = {"MODEL": "demo-tiny", "HOSTS": "10.0.0.1,10.0.0.2", "HELPER_RANK": "2", "ENV_FILE": str(tmp_path / "no.env")}
    with pytest.raises(ConfigError, match=r"^HELPER_RANK=2 names no rank: .* 2 rank\(s\).*set HELPER_RANK to one from "
                                          r"0 to 1"):
        load_settings(env)
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]')
    with pytest.raises(ConfigError, match="HOSTFILE=.* starts 2 rank"):
        load_settings({**env, "HOSTFILE": str(hostfile)})
    assert load_settings({**env, "HELPER_RANK": "1"}).HELPER_RANK == 1


def test_the_helper_preflight_runs_only_where_the_helper_rank_loads(tmp_path):
    from config import load_settings
    from ops.helpers_check import helper_host_is_here

    def here(hosts: str, k: int) -> bool:
        return helper_host_is_here(load_settings({"MODEL": "demo-tiny", "HOSTS": hosts, "HELPER_RANK": str(k),
                                                  "ENV_FILE": str(tmp_path / "no.env")}))

    assert here("10.0.0.1", 0) and here("127.0.0.1,127.0.0.1", 1) and here("10.0.0.1,10.0.0.1", 1)
    assert not here("10.0.0.1,10.0.0.2", 1)


def test_rank0s_desk_drops_the_queued_work_of_a_client_that_left():
    import queue

    inbound: queue.SimpleQueue = queue.SimpleQueue()
    desk = HelperDesk({"embedding": Loaded(FakeEmbedder())}, inbound, max_inputs=8, timeout=30)

    async def leaves_once_queued(conn, rid, scope, complaint):
        while inbound.empty():
            await anyio.sleep(0.01)
        scope.cancel()

    async def go():
        from engine.rank0.lanes import TokenizerLanes

        conn = type("Conn", (), {"last_frame_bytes": 10, "max_frame": 1 << 20})()
        with anyio.fail_after(30):
            return await desk.answer(conn, Embed(request_id="r", inputs=["a b"]), TokenizerLanes(), leaves_once_queued)

    assert anyio.run(go) == []
    assert inbound.get_nowait().cancelled.is_set()  # the step thread skips it: no slice computed for nobody
