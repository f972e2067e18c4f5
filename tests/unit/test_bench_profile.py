"""How bench/profile.py reads py-spy's output: raw stacks into categories and leaf functions, dumps into names."""

from __future__ import annotations

from bench import stacks

RUNPY = "thread (100): MainThread;_run_module_as_main (<frozen runpy>:198);<module> (engine/__main__.py:263)"
LOOP = RUNPY + ";Leader.run (engine/leader.py:86);Leader._lead (engine/leader.py:111)"
RAW = "\n".join([
    # the forward step, however deep in mlx-lm the sample landed
    LOOP + ";Leader._step (engine/leader.py:258);LockstepBatch.step (engine/lockstep/batch.py:237);"
           "BatchGenerator.next (mlx_lm/generate.py:1899);BatchGenerator._next (mlx_lm/generate.py:1819);"
           "GenerationBatch._step (mlx_lm/generate.py:1434) 60",
    # the step's own bookkeeping, outside BatchGenerator.next
    LOOP + ";Leader._step (engine/leader.py:258);LockstepBatch.step (engine/lockstep/batch.py:250) 5",
    LOOP + ";Leader._step (engine/leader.py:263);Scheduler.absorb (engine/rank0/scheduler.py:280);"
           "Detokenizer.add (engine/rank0/output.py:40) 10",
    LOOP + ";Leader._broadcast (engine/leader.py:236);"
           "PlanChannel.broadcast (engine/lockstep/channel.py:52);send (engine/lockstep/plan.py:116);"
           "PlanChannel.all_sum (engine/lockstep/channel.py:30) 8",
    LOOP + ";EngineServer.post (engine/rank0/server.py:86) 2",
    LOOP + ";Doorbell.ring (engine/lockstep/doorbell.py:82) 2",
    LOOP + ";Leader._drain_inbound (engine/leader.py:288) 15",
    # a truncated stack (py-spy read it while it changed): still somewhere
    "thread (100): MainThread;socket.__repr__ (socket.py:271) 1",
    "thread (107): engine-socket;Thread._bootstrap (threading.py:1002);"
    "EngineServer._relay (engine/rank0/server.py:250);"
    "FramedStream.send (ipc/framing.py:80) 3",
    "thread (107): engine-socket;Thread._bootstrap (threading.py:1002);BaseEventLoop._run_once "
    "(asyncio/base_events.py:1884);EpollSelector.select (selectors.py:468) 97",
    "thread (108): AnyIO worker thread;Thread._bootstrap (threading.py:1002);Queue.get (queue.py:171);"
    "Condition.wait (threading.py:327) 101",
    "thread (109): AnyIO worker thread;Thread._bootstrap (threading.py:1002);Queue.get (queue.py:171);"
    "Condition.wait (threading.py:327) 100",
    "thread (109): AnyIO worker thread;Thread._bootstrap (threading.py:1002);Prompter.tokens "
    "(engine/rank0/admission.py:50) 1",
    "",
    "not a stack line",
])


def test_a_raw_profile_parses_into_threads_frames_and_counts():
    parsed = stacks.parse_raw(RAW)
    assert len(parsed) == 13 and sum(s.count for s in parsed) == 405
    first = parsed[0]
    assert (first.tid, first.thread, first.count) == (100, "MainThread", 60)
    assert first.frames[0] == stacks.Frame("_run_module_as_main", "<frozen runpy>")
    assert first.frames[-1] == stacks.Frame("GenerationBatch._step", "mlx_lm/generate.py")


def test_the_engine_main_thread_splits_into_the_loop_s_parts():
    threads = stacks.shares(stacks.parse_raw(RAW), stacks.engine_rules)
    main = threads["MainThread"]
    assert main["samples"] == 103 and main["threads"] == 1
    assert main["categories"] == {
        "forward step (mlx-lm BatchGenerator.next)": 60,
        "plan broadcast / meeting (PlanChannel, all_sum, doorbell)": 10,  # waking the followers included
        "scheduler output work (Scheduler.absorb and below)": 10,
        "writing events to client sockets (EngineServer.post)": 2,
        "waiting for requests (Leader._drain_inbound)": 15,
        "step bookkeeping (LockstepBatch.step outside BatchGenerator.next)": 5,
        "other": 1,
    }
    assert threads["engine-socket"]["categories"] == {"framing / sending (FramedStream.send, msgpack)": 3,
                                                      "waiting for events (selector)": 97}
    workers = threads["AnyIO worker thread"]
    assert workers["threads"] == 2 and workers["samples"] == 202
    assert workers["categories"] == {"waiting (selector, queue, condition, sleep)": 201, "other": 1}


def test_leaves_leave_out_waiting_and_name_their_thread():
    leaves = stacks.top_leaves(stacks.parse_raw(RAW), stacks.engine_rules, 3)
    assert leaves == [("GenerationBatch._step (mlx_lm/generate.py)", "MainThread", 60),
                      ("Detokenizer.add (engine/rank0/output.py)", "MainThread", 10),
                      ("PlanChannel.all_sum (engine/lockstep/channel.py)", "MainThread", 8)]
    everything = stacks.top_leaves(stacks.parse_raw(RAW), stacks.engine_rules, 100)
    assert not any(leaf.startswith(("Leader._drain_inbound", "EpollSelector", "Condition.wait"))
                   for leaf, _, _ in everything)


def test_the_api_s_categories_put_encoding_reading_and_writing_apart():
    base = ("thread (5): MainThread;BaseEventLoop._run_once (asyncio/base_events.py:1922);"
            "RequestResponseCycle.run_asgi (uvicorn/protocols/http/h11_impl.py:403);"
            "StreamingResponse.stream_response (starlette/responses.py:255)")
    raw = "\n".join([
        base + ";_stream (api/generation.py:226);event (api/sse.py:20) 4",
        base + ";_stream (api/generation.py:224);ChatRenderer.delta (api/openai/render.py:50) 2",
        base + ";_stream (api/generation.py:219);next_event (api/generation.py:56);FramedStream.recv "
               "(ipc/framing.py:87);UNIXSocketStream.receive (anyio/_backends/_asyncio.py:1566) 7",
        base + ";RequestResponseCycle.send (uvicorn/protocols/http/h11_impl.py:490);Connection.send "
               "(h11/_connection.py:512) 3",
        "thread (5): MainThread;BaseEventLoop._run_once (asyncio/base_events.py:1922);EdgeProtocol.data_received "
        "(api/serve.py:70);Connection.next_event (h11/_connection.py:400) 1",
        base + ";_stream (api/generation.py:230);Metrics.tokens (api/metrics.py:84) 1",
        base + ";_stream (api/generation.py:231) 2",
        "thread (5): MainThread;BaseEventLoop._run_once (asyncio/base_events.py:1884);EpollSelector.select "
        "(selectors.py:468) 80",
    ])
    cats = stacks.shares(stacks.parse_raw(raw), stacks.api_rules)["MainThread"]["categories"]
    assert cats == {"SSE / JSON encoding (api render, sse, msgspec)": 6,
                    "engine socket reading (ipc framing, engine_client)": 7,
                    "uvicorn/h11 writing (RequestResponseCycle.send)": 3,
                    "HTTP reading (uvicorn protocol, h11 parsing)": 1,
                    "metrics and access log (api/metrics.py, api/access.py)": 1,
                    "waiting for events (selector)": 80,
                    "other": 2}


def test_a_dump_names_each_thread_by_its_os_id():
    dump = '''Process 18026: /work/main/.venv/bin/python -m engine
Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

Thread 18026 (active+gil): "MainThread"
    GenerationBatch._step (mlx_lm/generate.py:1434)
Thread 18028 (idle): "engine-socket"
    EpollSelector.select (selectors.py:468)
Thread 0x7F00 (idle)
    f (x.py:1)
'''
    assert stacks.dump_threads(dump) == {18026: ("MainThread", "active+gil"), 18028: ("engine-socket", "idle"),
                                         0x7F00: ("", "idle")}
