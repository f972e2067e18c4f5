"""Rank 0's answers to Embed and Rerank: checked and tokenized in the socket thread's workers, computed by the step
thread between steps (engine/helpers/work.py), answered on the request's own connection. Neither the plan nor the
other ranks ever see them; closing the connection drops the request's work still queued.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

from engine.helpers.work import Job
from engine.rank0 import errors
from engine.rank0.errors import Refused
from ipc import Embed, Embedded, Error, Msg, Rerank, Reranked

log = logging.getLogger(__name__)

SETTING = {"embedding": "EMBEDDING_MODEL", "rerank": "RERANK_MODEL"}
ENDPOINT = {"embedding": "embeddings are", "rerank": "reranking is"}
FRAME_ROW_OVERHEAD = 8  # msgpack's bin header of one embedding


def not_served(kind: str, request_id: str) -> Error:
    """404: no helper of this kind is loaded."""
    return Error(status=404, code="model_not_found", request_id=request_id,
                 message=f"this server serves no {kind} model, so {ENDPOINT[kind]} not available here: the operator "
                         f"sets {SETTING[kind]} (docs/helpers.md) and restarts the engine")


class HelperDesk:
    """The helpers by kind (engine/helpers/load.py Loaded), and the queue to the step thread."""

    def __init__(self, helpers: dict[str, Any], inbound: queue.SimpleQueue, max_inputs: int, timeout: float):
        self.helpers = helpers
        self.inbound = inbound
        self.max_inputs = max_inputs  # HELPER_MAX_INPUTS
        self.timeout = timeout  # REQUEST_TIMEOUT

    async def answer(self, conn: Any, msg: Embed | Rerank, lanes: Any, watch: Callable) -> list[Msg]:
        """The frames answering msg (none: the client left); watch(conn, rid, scope, complaint) ends it if the client
        goes."""
        rid = msg.request_id
        kind = "embedding" if isinstance(msg, Embed) else "rerank"
        loaded = self.helpers.get(kind)
        if loaded is None:
            return [not_served(kind, rid)]
        helper = loaded.helper
        loop = asyncio.get_running_loop()
        settled: asyncio.Future = loop.create_future()
        job: Job | None = None
        complaint: list[Msg] = []
        reply: list[Msg] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, conn, rid, tg.cancel_scope, complaint)
            try:
                inputs = await lanes.run(lambda m: self._tokens(m, helper), msg, conn.last_frame_bytes)
                job = Job(helper, inputs, lambda result: loop.call_soon_threadsafe(_settle, settled, result),
                          scores=kind == "rerank")
                self.inbound.put(job)
                with anyio.fail_after(self.timeout):
                    result = await settled
                reply = self._reply(msg, inputs, result, conn.max_frame)
            except Refused as exc:
                reply = [exc.to(rid)]
            except TimeoutError:
                reply = [errors.timed_out(rid)]
            tg.cancel_scope.cancel()
        # awaiting the future and cancelled (the client left) cancels the future too: that is no answer either
        if job is not None and (not settled.done() or settled.cancelled()):
            job.cancelled.set()  # the client left, or time ran out: its slices are not computed
        return complaint[:1] if complaint else reply

    def _reply(self, msg: Embed | Rerank, inputs: list[list[int]], result: Any, max_frame: int) -> list[Msg]:
        rid = msg.request_id
        if isinstance(result, BaseException):
            return [errors.generation_failed(rid, f"the engine failed to compute this request "
                                                  f"({type(result).__name__}; see the engine log); other requests are "
                                                  "unaffected")]
        tokens = sum(len(ids) for ids in inputs)
        if isinstance(msg, Rerank):
            return [Reranked(request_id=rid, scores=[float(s) for s in result], prompt_tokens=tokens)]
        rows = result
        if msg.dimensions:  # matryoshka: the first dimensions, renormalized
            rows = rows[:, :msg.dimensions]
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        rows = rows.astype("<f4")
        per_frame = max(1, (max_frame // 2) // max(1, rows.shape[1] * 4 + FRAME_ROW_OVERHEAD))
        return [Embedded(request_id=rid, embeddings=[row.tobytes() for row in rows[i:i + per_frame]],
                         prompt_tokens=tokens, dimensions=rows.shape[1], index=i, more=i + per_frame < len(rows))
                for i in range(0, len(rows), per_frame)]

    # -- checks and tokens (a worker thread) -----------------------------------------------
    def _count(self, n: int, param: str, what: str) -> None:
        if n == 0:
            raise Refused(f"'{param}' is empty: send at least one {what}", param)
        if n > self.max_inputs:
            raise Refused(f"'{param}' has {n} {what}s, more than this server's limit of {self.max_inputs} "
                          "(HELPER_MAX_INPUTS); send them in several requests", param)

    def _tokens(self, msg: Embed | Rerank, helper: Any) -> list[list[int]]:
        if isinstance(msg, Rerank):
            return self._pairs(msg, helper)
        param = msg.param
        self._count(len(msg.inputs), param, "input")
        if msg.dimensions and not helper.matryoshka:
            raise Refused(f"'dimensions' cannot be set for {helper.name}: it was not trained to be cut to fewer "
                          "dimensions (matryoshka); leave dimensions out", "dimensions")
        if not 0 <= msg.dimensions <= helper.dimensions:
            raise Refused(f"'dimensions' must be from 1 to {helper.dimensions} for {helper.name}, not "
                          f"{msg.dimensions}", "dimensions")
        return [self._one(item, f"{param}[{i}]", msg.truncate, helper) for i, item in enumerate(msg.inputs)]

    def _one(self, item: str | list[int], param: str, truncate: bool, helper: Any) -> list[int]:
        if isinstance(item, str):
            if not item:
                raise Refused(f"'{param}' is an empty string: send text to embed", param)
            ids = helper.tokenize(item)
        else:
            vocab = getattr(helper, "vocab_size", 0)
            if not item:
                raise Refused(f"'{param}' is an empty list of token ids: send at least one token", param)
            if not vocab:
                raise Refused(f"'{param}': {helper.name} takes text, not token ids; send the text", param)
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise Refused(f"'{param}' holds token id {bad}, outside {helper.name}'s vocabulary of {vocab}", param)
            ids = list(item)
        if len(ids) > helper.max_tokens:
            if not truncate:
                raise Refused(f"'{param}' is {len(ids)} tokens long, more than {helper.name}'s limit of "
                              f"{helper.max_tokens}; shorten it", param, "context_length_exceeded")
            # text keeps its last token: the special token the card appends (EOS, [SEP]) is what pooling reads
            ids = ids[:helper.max_tokens - 1] + ids[-1:] if isinstance(item, str) else ids[:helper.max_tokens]
        return ids

    def _pairs(self, msg: Rerank, helper: Any) -> list[list[int]]:
        param = msg.param
        self._count(len(msg.documents), param, "document")
        if not msg.query:
            raise Refused("'query' is an empty string: send the text to rank the documents by", "query")
        out = []
        for i, doc in enumerate(msg.documents):
            ids = helper.pair_tokens(msg.query, doc)
            if len(ids) > helper.max_tokens:
                raise Refused(f"'{param}[{i}]' with the query is {len(ids)} tokens long, more than {helper.name}'s "
                              f"limit of {helper.max_tokens}; shorten the document or the query", f"{param}[{i}]",
                              "context_length_exceeded")
            out.append(ids)
        return out


def _settle(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)
