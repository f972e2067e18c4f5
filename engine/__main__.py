"""`python -m engine`: one rank of the engine (mlx.launch starts one per host; one rank may run alone)."""

from __future__ import annotations

import faulthandler
import logging
import logging.handlers
import os
import queue
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any


def _detach_stdin() -> None:
    # mlx.launch keeps forwarding our stdin in a busy select loop until its write fails;
    # closing our end makes that write fail (EPIPE), and the launcher goes quiet.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _rank_from_env() -> int:
    return int(os.environ.get("MLX_RANK", "0") or 0)


def _setup_logging(level: str, rank: int, log_dir) -> None:
    # stderr reaches engine.log through mlx.launch; the per-rank file survives the launcher
    # (its forwarding dies first when the process group is signalled).
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(
            log_dir / f"engine.rank{rank}.log", maxBytes=20 * 1024 * 1024, backupCount=3))
    except OSError as exc:
        print(f"rank{rank}: cannot write a log file in {log_dir}: {exc}", file=sys.stderr)
    for h in handlers:
        h.setFormatter(fmt)
    logging.basicConfig(level=level, handlers=handlers)


def _socket_is_live(path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


@dataclass
class Joined:
    """This rank after joining its group and loading its shard."""

    group: Any
    rank: int
    size: int
    loaded: Any  # engine.model.LoadedModel
    started: float
    helpers: dict = field(default_factory=dict)  # HELPER_RANK's helper models by kind (engine/helpers/load.py Loaded)
    remote: Any = None  # rank 0, HELPER_RANK > 0: its forwarder to that rank (engine/rank0/helper_remote.py)


def main() -> int:
    _detach_stdin()
    from config import ConfigError, load_settings
    from ipc.lifecycle import ExitCause

    rank = _rank_from_env()
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"rank{rank} configuration error: {exc}", file=sys.stderr)
        return ExitCause.CONFIG
    _setup_logging(settings.LOG_LEVEL, rank, settings.log_dir)
    # `kill -USR1 <pid>` dumps every thread's stack to the log: the first question about a hang.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = logging.getLogger("engine")

    if rank == 0 and _socket_is_live(settings.socket_path):
        log.error("another engine is already serving on %s; stop it first (./launch.sh stop)", settings.socket_path)
        return ExitCause.FAILED
    if rank == 0 and os.path.lexists(settings.socket_path) and not settings.socket_path.is_socket():
        log.error("SOCKET_PATH %s exists and is not a socket; move it away or set SOCKET_PATH (or RUN_DIR) to "
                  "another path", settings.socket_path)
        return ExitCause.FAILED

    from engine.model import ModelError
    from engine.watchdog import Watchdog
    from ipc import raise_open_file_limit

    watchdog = Watchdog(settings.ENGINE_START_TIMEOUT, rank)
    watchdog.start()
    try:
        joined = _join(settings, watchdog)
    except ModelError as exc:
        log.error("%s", exc)  # the supervisor relays this line as the reason (ExitCause.MODEL)
        return ExitCause.MODEL
    except RuntimeError as exc:
        # what engine.model lets through at load: a collective lost its peer (a rank that could not load its
        # shard), so the supervisor blames that rank, not this one
        log.critical("rank %d: %s; a peer rank is gone, ending this rank", rank, exc)
        return ExitCause.PEER_LOST
    # A socket per stream; after _join, since importing mlx_lm sets the limits to 2048 (soft) and 4096 (hard).
    log.debug("open-file limit %d", raise_open_file_limit())
    from engine.lockstep.doorbell import DoorbellError

    try:
        loop, server = _build(settings, joined, watchdog)
    except ModelError as exc:  # rank 0's proposer (SPECULATIVE) cannot be built: the model's answer, in a sentence
        log.error("%s", exc)
        return ExitCause.MODEL
    except DoorbellError as exc:  # its port taken or blocked: the sentence says which and what to do
        log.critical("%s", exc)
        return ExitCause.FAILED

    def on_signal(signum, frame):  # never log in a signal handler
        loop.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return _serve(settings, joined, loop, server)


def _join(settings, watchdog) -> Joined:
    """Join the group (several ranks) and load this rank's shard; raises ModelError."""
    import mlx.core as mx

    from engine.loading import load
    from engine.model import ModelError

    group, rank = None, _rank_from_env()
    if "MLX_RANK" in os.environ:
        watchdog.beat(f"joining the {settings.BACKEND} group")
        group = mx.distributed.init(strict=True, backend=settings.BACKEND)
        rank = group.rank()
    size = group.size() if group is not None else 1
    if settings.HELPER_RANK >= size:  # every rank alike, before minutes of loading
        raise ModelError(f"HELPER_RANK={settings.HELPER_RANK} names no rank: this engine runs {size} rank(s), "
                         f"numbered from 0; set HELPER_RANK to one from 0 to {size - 1}")
    started = time.time()
    helpers = {}
    if rank == settings.HELPER_RANK:
        from engine.helpers.load import load_helpers

        # First: a helper that cannot load ends the start before the big model's minutes of loading. Its weights
        # are evaluated now, so every memory report (and the KV budget made from them) counts them.
        watchdog.beat("loading the helper models")
        helpers = load_helpers(settings)
    watchdog.beat("loading the model")
    loaded = load(settings, group)
    if settings.SPECULATIVE == "mtp":
        loaded = _with_heads(settings, loaded, group, rank)
    how = {"single": "whole", "tensor": "tensor parallel"}.get(loaded.parallel, loaded.parallel + " parallel")
    if loaded.pipeline_split:
        how += f": {loaded.pipeline_split[rank]} of {sum(loaded.pipeline_split)} layers"
    logging.getLogger("engine").info(
        "rank %d of %d joined: model %s loaded from %s (context %d, %s) in %.1f s, pid %d, host %s", rank, size,
        settings.model_name, loaded.path, loaded.context_length, how, time.time() - started, os.getpid(),
        socket.gethostname())
    return Joined(group, rank, size, loaded, started, helpers)


def _with_heads(settings, loaded, group, rank: int):
    """SPECULATIVE=mtp: the model with its checkpoint's MTP heads, on every rank that holds them (every rank, sharded,
    under tensor parallel; the last stage alone under pipeline: engine.parallel.holds_heads); raises ModelError in
    one sentence where the checkpoint ships none or the settings cannot run them."""
    import dataclasses

    from engine.model import ModelError
    from pathlib import Path

    from engine.parallel import holds_heads
    from engine.speculative.mtp import mtp_refusal
    from engine.speculative.mtp_model import StageModel, with_heads

    if not holds_heads(loaded.parallel, rank, list(loaded.pipeline_split)):
        # an earlier pipeline stage: its caches are its own layers' alone; it refuses a checkpoint without heads
        # as the last stage does, from the files
        if why := mtp_refusal(Path(loaded.path)):
            raise ModelError(why)
        return dataclasses.replace(loaded, model=StageModel(loaded.model))
    tensor = group if loaded.parallel == "tensor" else None
    return dataclasses.replace(loaded, model=with_heads(loaded, tensor, settings.kv_bits, settings.KV_GROUP_SIZE))


def _build(settings, joined: Joined, watchdog):
    """The step loop of this rank, and on rank 0 the socket server that feeds it."""
    from engine.decoding.constrained import Grammars
    from engine.helpers.load import configured
    from engine.kv_measure import measure_or_none
    from engine.lockstep.batch import LockstepBatch
    from engine.lockstep.channel import PlanChannel
    from engine.lockstep.cuts import CacheCuts
    from engine.lockstep.doorbell import open_doorbell
    from engine.lockstep.loop import StepLoop
    from engine.rank0.links import LinkProbes
    from engine.ranks import decode_hostnames, hostname_row, local_row

    tokenizer = joined.loaded.tokenizer
    # Every rank samples, so every rank compiles grammars against its own tokenizer.
    grammars = Grammars(tokenizer)
    grammars.warm_up_in_background()
    batch = LockstepBatch(joined.loaded.model, set(tokenizer.eos_token_ids), settings.PREFILL_TOKENS_PER_STEP,
                          settings.MAX_BATCH, grammars, images=joined.loaded.image_table)
    channel = PlanChannel(joined.group if joined.size > 1 else None, settings.PLAN_BUFFER_BYTES, batch.gen.stream)
    watchdog.timeout = settings.WATCHDOG_TIMEOUT
    watchdog.beat("measuring the KV cache")
    # every rank measures its own caches (a sharded model's layers meet in their collectives), and rank 0 learns all
    memory, kv_dtype = measure_or_none(joined.loaded.model)
    watchdog.beat("gathering the KV measurements")  # its own deadline: a slow peer's first passes are not a dead one
    kv_rows = channel.gather([1, *memory.row()] if memory is not None else [0] * 9)
    # which prefix cache entries may be cut: the same rule on every rank, though pipeline ranks hold other layers
    batch.prefix.cuts = CacheCuts.strictest(channel.gather(batch.prefix.cuts.row()))
    pace = _pace(settings, joined, batch, channel, watchdog)
    watchdog.beat("starting the step loop")
    # One startup exchange names every rank's host for status and /health...
    hosts = decode_hostnames(channel.gather(hostname_row()))
    # ...and every rank announces its pid before rank 0 serves: the supervisor learns the ranks from
    # Info.rank_states, complete from rank 0's first answer.
    announced = channel.gather(local_row(0))
    doorbell = None
    if joined.size > 1:
        watchdog.beat("connecting the doorbell")  # idle ranks sleep on it instead of meeting in a collective
        doorbell = open_doorbell(joined.rank, joined.size, channel.gather, port=settings.doorbell_port)
    side = None
    if joined.size > 1 and settings.HELPER_RANK and configured(settings):
        from engine.helpers.rank_setup import open_link

        side, joined.remote = open_link(settings, joined.rank, joined.helpers, channel.gather, doorbell, watchdog.beat)
    links = LinkProbes(joined.size, settings.BACKEND, hosts)  # the same pairs on every rank
    speculating = _can_speculate(settings, joined, channel)
    proposer = _speculation(settings, joined, channel, watchdog) if speculating else None
    if settings.SPECULATIVE == "mtp" and speculating and hasattr(joined.loaded.model, "chain") and batch.verifies:
        # every rank holding heads chains them (tensor parallel: their all_sums must meet); under pipeline only the
        # last stage, rank 0, whose proposer reads the drafts where they were made
        batch.chain_tokens = settings.NUM_DRAFT_TOKENS
        if proposer is not None:
            proposer.read_from(batch)
    batch.disk.agree = channel.gather  # a plan that restores from disk: the ranks agree which entries all loaded
    if joined.rank != 0:
        from engine.disk_tier import open_in_background

        open_in_background(settings, joined.loaded, joined.rank, joined.size, lambda tier: _open_disk(batch, tier))
        return StepLoop(batch, channel, watchdog, doorbell, links.pairs, side), None
    return _rank0(settings, joined, watchdog, grammars, batch, channel, hosts, announced, doorbell, kv_rows, links,
                  proposer, pace, kv_dtype)


def _open_disk(batch, tier, planner=None) -> None:
    """This rank's disk tier is open (from its background thread): stores are written through from now on; rank 0
    then reads the entries already on disk into its index (engine/rank0/disk_index.py)."""
    from engine.disk_tier import scan_into

    batch.disk.tier = tier
    if planner is not None:
        planner.tier = tier  # what the cap evicts is forgotten by the index (engine/rank0/disk_plan.py)
        scan_into(tier, planner.index)
        planner.index.scan_done()


def _pace(settings, joined: Joined, batch, channel, watchdog):
    """The prefill chunk every rank uses: PREFILL_TOKENS_PER_STEP, or less where the slowest rank's prefill would
    take too much of WATCHDOG_TIMEOUT (engine/prefill_pace.py)."""
    from engine import mlx_compat
    from engine.prefill_pace import agree, row, seconds_per_token

    watchdog.beat("timing a prefill")
    pace = agree(channel.gather(row(seconds_per_token(joined.loaded.model))), settings.WATCHDOG_TIMEOUT,
                 settings.PREFILL_TOKENS_PER_STEP)
    batch.prefill_budget = pace.chunk
    mlx_compat.set_prefill_chunk(batch.gen, pace.chunk)
    if pace.chunk < settings.PREFILL_TOKENS_PER_STEP:
        logging.getLogger("engine").warning(
            "prefill: %d tokens per step, not PREFILL_TOKENS_PER_STEP=%d: the slowest rank prefills %.1f tokens/s, "
            "and a step must stay well within WATCHDOG_TIMEOUT=%g s (a faster host or GPU prefills more)",
            pace.chunk, settings.PREFILL_TOKENS_PER_STEP, pace.tokens_per_second, settings.WATCHDOG_TIMEOUT)
    else:
        logging.getLogger("engine").info("prefill: %d tokens per step (the slowest rank prefills %.0f tokens/s)",
                                         pace.chunk, pace.tokens_per_second)
    return pace


def _speculation(settings, joined: Joined, channel, watchdog):
    """Rank 0's proposer (None elsewhere), asked where every rank can verify (_can_speculate). Every rank learns
    whether rank 0 could build it, so a proposer that cannot be built (a draft of another tokenizer, no MTP heads)
    ends every rank with rank 0's sentence (ModelError) rather than leaving them waiting for a plan."""
    from engine.model import ModelError

    proposer, why = None, ""
    if joined.rank == 0:
        watchdog.beat(f"building the {settings.SPECULATIVE} proposer")
        try:
            proposer = _proposer(settings, joined.loaded, joined.loaded.tokenizer)
        except ModelError as exc:
            why = str(exc)
    if not channel.gather([0 if why else 1])[0][0]:
        raise ModelError(why or f"rank 0 could not build the SPECULATIVE={settings.SPECULATIVE} proposer (see its "
                                "log); ending this rank with it")
    return proposer


def _can_speculate(settings, joined: Joined, channel) -> bool:
    """SPECULATIVE is on and every rank's caches can verify drafts (pipeline ranks hold different layers: all are
    asked, each rank alike); else rank 0 says in one line why the model decodes plainly."""
    from engine.speculative.choose import cannot_verify

    if settings.SPECULATIVE == "off":
        return False
    why = cannot_verify(joined.loaded.model)
    rows = channel.gather([0 if why else 1])
    if joined.rank == 0 and not all(row[0] for row in rows):
        where = why or f"rank(s) {[r for r, row in enumerate(rows) if not row[0]]} hold caches that cannot"
        logging.getLogger("engine").warning("SPECULATIVE=%s: this model decodes without speculation: %s",
                                            settings.SPECULATIVE, where)
    return all(row[0] for row in rows)


def _rank0(settings, joined: Joined, watchdog, grammars, batch, channel, hosts, announced, doorbell, kv_rows,
           links, proposer, pace, kv_dtype: str):
    """Rank 0's scheduler, admission and socket server around the step loop."""
    from engine.leader import Leader, LoopStats
    from engine.disk_tier import open_in_background
    from engine.helpers.work import HelperWork
    from engine.rank0.admission import Prompter
    from engine.rank0.helper_desk import HelperDesk
    from engine.rank0.disk_plan import disk_info
    from engine.rank0.kv_precision import label
    from engine.rank0.logprobs import extract
    from engine.rank0.prefix_index import PrefixIndex, prefix_info, prompt_cache_budget
    from engine.rank0.requests import Counters
    from engine.rank0.scheduler import Scheduler
    from engine.rank0.server import MULTIRANK_DIRECT_CONNECTIONS, EngineServer
    from engine.rank0.validate import Limits
    from engine.vision.load import vision_prompts
    from engine.ranks import RankReports
    from ipc import Info, test_hooks

    loaded, tokenizer = joined.loaded, joined.loaded.tokenizer
    counters, stats, reports = Counters(), LoopStats(), RankReports(hosts)
    helpers = joined.helpers or {}
    # the helpers' states: rank 0's own, or what HELPER_RANK told at startup (its memory reports include them)
    helper_states = joined.remote.states if joined.remote else [h.state(0) for h in helpers.values()]
    reports.helper_bytes = {settings.HELPER_RANK: sum(h.weight_bytes for h in helper_states)}
    helper_work = HelperWork(settings.HELPER_TOKENS_PER_STEP, watchdog.beat)
    reports.update(announced)
    inbound: queue.SimpleQueue = queue.SimpleQueue()
    kv, measured = _kv_budget(settings, loaded, joined.size, reports.snapshot(), kv_rows, pace.chunk)
    cache_budget = prompt_cache_budget(settings.PROMPT_CACHE_BYTES, reports.snapshot())
    if kv.enabled and cache_budget > kv.budget:
        # the prefix cache lives inside the KV budget: more than all of it could never be held
        logging.getLogger("engine").log(
            logging.WARNING if settings.PROMPT_CACHE_BYTES >= 0 else logging.INFO,
            "the prefix cache's budget (%d bytes, PROMPT_CACHE_BYTES=%d) exceeds the KV memory budget (%d bytes): "
            "it gets the KV memory budget", cache_budget, settings.PROMPT_CACHE_BYTES, kv.budget)
        cache_budget = kv.budget
    logging.getLogger("engine").info("prefix cache: %s", f"{cache_budget / 2**20:.0f} MiB per rank" if cache_budget
                                     else "off")
    scheduler = Scheduler(settings.MAX_BATCH, set(tokenizer.eos_token_ids), counters, extract,
                          PrefixIndex(cache_budget, batch.prefix.cuts, settings.MAX_LIVE_BUFFERS), kv)
    disk_index = scheduler.disk.index
    open_in_background(settings, loaded, 0, joined.size, lambda tier: _open_disk(batch, tier, scheduler.disk))
    backend = settings.BACKEND if joined.size > 1 else "single"
    # the float type rank 0 measured its keys and values in, else the one config.json names
    precision = label(settings.kv_bits, settings.KV_GROUP_SIZE, kv_dtype or loaded.facts.dtype)
    kv_bits = settings.kv_bits or 0
    spec_mode = settings.SPECULATIVE if proposer is not None else "off"
    if test_hooks.ENABLED:
        logging.getLogger("engine").warning("%s=1: test-only fault hooks are read (never set it when serving)",
                                            test_hooks.SWITCH)

    def info() -> Info:
        return Info(model=settings.model_name, model_path=loaded.path, context_length=loaded.context_length,
                    ranks=joined.size, backend=backend, created=int(joined.started), engine_pid=os.getpid(),
                    uptime=time.time() - joined.started, step=stats.step, last_step_age=watchdog.age(),
                    active=counters.active, queued=counters.waiting, max_batch=settings.MAX_BATCH,
                    max_queue=settings.MAX_QUEUE,
                    rank_states=reports.snapshot(doorbell.unanswered() if doorbell is not None else None),
                    step_time_sum=stats.step_time_sum, step_time_count=stats.step_time_count,
                    broadcast_time_sum=stats.broadcast_time_sum, broadcast_time_count=stats.broadcast_time_count,
                    facts=loaded.facts, **prefix_info(scheduler.prefix),
                    **disk_info(disk_index, batch.disk.tier.stats() if batch.disk.tier is not None else None),
                    kv_budget_bytes=kv.budget if kv.enabled else 0, kv_reserved_bytes=scheduler.kv_reserved,
                    kv_token_bytes=kv.token_bytes, kv_window_token_bytes=kv.window_token_bytes,
                    kv_window=kv.window, kv_constant_bytes=kv.constant_bytes, kv_measured=measured,
                    kv_precision=precision, kv_bits=kv_bits, kv_group_size=settings.KV_GROUP_SIZE if kv_bits else 0,
                    parallel=loaded.parallel, pipeline_layers=list(loaded.pipeline_split),
                    parallel_note=loaded.parallel_note,
                    links=links.snapshot(), spec_mode=spec_mode, spec_draft_tokens=settings.NUM_DRAFT_TOKENS,
                    spec_proposed_tokens=stats.spec_proposed, spec_accepted_tokens=stats.spec_accepted,
                    spec_forward_passes=stats.spec_forward_passes, spec_emitted_tokens=stats.spec_emitted,
                    prefill_chunk=pace.chunk, prefill_tokens_per_second=pace.tokens_per_second,
                    spec_decode_positions=stats.decode_positions,
                    test_hooks=test_hooks.ENABLED, helpers=helper_states, helper_inputs=helper_work.stats.inputs,
                    helper_tokens=helper_work.stats.tokens, helper_seconds=helper_work.stats.seconds)

    limits = Limits(vocab_size=len(tokenizer), logits_size=loaded.vocab_size, context_length=loaded.context_length,
                    max_batch=settings.MAX_BATCH, max_queue=settings.MAX_QUEUE,
                    vision=loaded.image_table is not None, model=settings.model_name)
    prompter = Prompter(tokenizer, limits, grammars, kv, vision=vision_prompts(settings, loaded),
                        model_name=settings.model_name)
    desk = joined.remote or HelperDesk(helpers, inbound, settings.HELPER_MAX_INPUTS, settings.REQUEST_TIMEOUT)
    server = EngineServer(settings, prompter, counters, inbound, info, desk)
    if joined.size > 1:
        server.direct_limit = MULTIRANK_DIRECT_CONNECTIONS
    loop = Leader(batch, channel, watchdog, settings.DRAIN_TIMEOUT, doorbell, scheduler, server, inbound, reports,
                  stats, links, proposer, settings.NUM_DRAFT_TOKENS, helper_work)
    return loop, server


def _proposer(settings, loaded, tokenizer):
    """Rank 0's proposer for SPECULATIVE; raises ModelError (a draft of another tokenizer, no MTP heads)."""
    from engine.speculative.choose import make_proposer

    proposer = make_proposer(settings, loaded, tokenizer)
    logging.getLogger("engine").info("speculative decoding: %s, up to %d draft token(s) per sequence and step",
                                     settings.SPECULATIVE, settings.NUM_DRAFT_TOKENS)
    return proposer


def _kv_budget(settings, loaded, ranks: int, states, kv_rows: list[list[int]], prefill_chunk: int):
    """The KV memory budget per rank, and what a sequence takes on the largest rank: as every rank measured its
    caches, or where one could not, one token's K and V from the model's config."""
    from engine.rank0.kv_budget import KVBudget, KVMemory, memory_budget, size, token_bytes

    log = logging.getLogger("engine")
    budget = memory_budget(settings.KV_MEMORY_BYTES, states)
    if all(row[0] for row in kv_rows):
        memory = KVMemory.largest(KVMemory.from_row(row[1:]) for row in kv_rows)
    else:
        # pipeline: a rank holds whole layers, the KV of its share of them (the largest share, for every rank)
        memory = KVMemory(token_bytes(loaded.facts.config, ranks, loaded.facts.dtype,
                                      max(loaded.pipeline_split, default=0), settings.kv_bits, settings.KV_GROUP_SIZE))
        log.warning("KV memory: rank(s) %s could not measure the model's caches (see their log): one token's KV "
                    "is estimated from the config (%d bytes), too high for MLA, sliding-window and linear-attention "
                    "models", [r for r, row in enumerate(kv_rows) if not row[0]], memory.token_bytes)
    kv = KVBudget.of(budget, memory, prefill_chunk)
    if budget and not kv.enabled:
        log.warning("KV memory: neither the model's caches nor its config give the size of its KV, so a "
                    "request's KV cannot be estimated and KV_MEMORY_BYTES is not enforced")
    elif not budget:
        log.log(logging.INFO if settings.KV_MEMORY_BYTES == 0 else logging.WARNING,
                "KV memory: no limit (%s); a long prompt or a big batch can exhaust the host's memory",
                "KV_MEMORY_BYTES=0" if settings.KV_MEMORY_BYTES == 0 else "the ranks do not report their memory")
    else:
        log.info("KV memory: %s per rank for running sequences and the prefix cache (%s)", size(budget),
                 kv.memory.describe())
    return kv, all(row[0] for row in kv_rows)


def _serve(settings, joined: Joined, loop, server) -> int:
    """Run the step loop until shutdown; the exit cause says how it ended."""
    from engine.lockstep.batch import DesyncError
    from engine.lockstep.plan import PlanError
    from ipc.lifecycle import ExitCause

    log = logging.getLogger("engine")
    if server is not None:
        try:
            server.start()
        except OSError as exc:
            log.error("cannot serve on %s: %s", settings.socket_path, exc)
            return ExitCause.FAILED
        log.info("rank 0 serving %s on %s (%d rank%s, backend %s)", settings.model_name, settings.socket_path,
                 joined.size, "s" if joined.size > 1 else "", settings.BACKEND if joined.size > 1 else "single")
    try:
        loop.run()
    except (DesyncError, PlanError) as exc:
        log.critical("%s; ending the engine (no silent divergence)", exc)
        return ExitCause.DESYNC
    except RuntimeError as exc:
        # mlx raises RuntimeError when a collective loses its peer ("[ring] connection to a peer was lost").
        log.critical("rank %d: %s; a peer rank is gone, ending this rank", joined.rank, exc)
        return ExitCause.PEER_LOST
    finally:
        if server is not None:
            server.stop()
        loop.batch.disk.close()
    log.info("rank %d stopped cleanly", joined.rank)
    return ExitCause.CLEAN


if __name__ == "__main__":
    sys.exit(main())
