"""`./launch.sh status`: what runs, in words; exit 0 all up, 1 partly up or dead, 3 all stopped."""

from __future__ import annotations

import time

from ipc.messages import Info
from ops import drain_watch
from ops.api_ctl import ApiCtl
from ops.engine_ctl import EngineCtl
from ops.layout import API_STOP_GRACE, Layout
from ops.pidfile import PidFile, Record
from ops.procs import KILL_WAIT, group_alive, group_frozen, process_alive
from ops.state import ACTIVE, read_state, state_path

UP, STOPPED = 0, 3
PARTLY = 1

# How long past its deadline a replaced API may still run while its drain watcher is killing it: the
# watcher looks every CHECK_EVERY s, then gives TERM KILL_GRACE s and the kernel KILL_WAIT s.
OVERDUE_SLACK = drain_watch.CHECK_EVERY + drain_watch.KILL_GRACE + KILL_WAIT


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _parallel(i: Info) -> str:
    if i.parallel == "pipeline" and i.pipeline_layers:
        return f" (pipeline parallel: layers {' + '.join(map(str, i.pipeline_layers))})"
    return f" ({i.parallel} parallel)" if i.parallel == "tensor" else ""


def describe_info(i: Info) -> str:
    """A readable view of rank 0's Info."""
    lines = [
        f"  model     {i.model}  ({i.model_path}, context {i.context_length} tokens)",
        f"  ranks     {i.ranks}{_parallel(i)}, backend {i.backend}, engine pid {i.engine_pid}, up {_duration(i.uptime)}",
        f"  step      {i.step}  (last step {i.last_step_age:.1f}s ago)",
        f"  requests  {i.active} active of {i.max_batch} slots, {i.queued} queued of {i.max_queue}",
        _prefill(i),
        _prompt_cache(i),
        _prompt_cache_disk(i),
        _speculative(i),
        _kv_memory(i),
    ]
    for r in i.rank_states:
        used = r.host_memory_total - r.host_memory_available
        lines.append(f"  rank {r.rank:<4} {r.host or '?'}  pid {r.pid}  step {r.step}  reported {r.report_age:.1f}s ago"
                     f"  memory {_size(r.active_memory)} (cache {_size(r.cache_memory)}, peak {_size(r.peak_memory)})"
                     f"  host {_size(used)} of {_size(r.host_memory_total)} used"
                     f"  prefix cache {_size(r.prompt_cache_bytes)}"
                     + (f"  helpers {_size(r.helper_bytes)}" if r.helper_bytes else "")
                     + (f"  NOT ANSWERING for {r.unanswered:.0f}s (frozen or gone)" if r.unanswered >= 1 else ""))
    lines += [f"  helper    {h.kind} {h.name} on rank {h.rank} ({h.family}, {_size(h.weight_bytes)}, up to "
              f"{h.max_tokens} tokens{f', {h.dimensions} dimensions' if h.dimensions else ''})" for h in i.helpers]
    if i.parallel_note:  # PARALLEL=auto chose pipeline: why, so nobody wonders where tensor's speed went
        lines.insert(2, f"            {i.parallel_note}")
    lines += [_link(link) for link in i.links]
    if i.ranks > 1 and not i.links:
        lines.append("  links     not probed yet (the engine probes them when idle, about once a minute)")
    return "\n".join(lines)


def _link(link) -> str:
    return (f"  link {link.a}-{link.b}  {link.host_a or '?'} - {link.host_b or '?'}  latency "
            f"{link.latency_seconds * 1e6:.0f} us  bandwidth {_rate(link.bandwidth_bytes_per_second)}  "
            f"probed {link.age:.0f}s ago ({_size(link.probe_bytes)} in {link.probe_seconds * 1e3:.1f} ms)")


def _rate(n: float) -> str:
    return f"{n / 1e9:.2f} GB/s" if n >= 1e9 else f"{n / 1e6:.1f} MB/s"


def _prefill(i: Info) -> str:
    if not i.prefill_chunk:
        return "  prefill   tokens per step not reported (an engine older than this status)"
    rate = f" (the slowest rank prefills {i.prefill_tokens_per_second:.1f} tokens/s)" if i.prefill_tokens_per_second \
        else ""
    return f"  prefill   {i.prefill_chunk} prompt tokens per step{rate}"


def _prompt_cache(i: Info) -> str:
    if not i.prompt_cache_budget:
        return "  prefix cache off (PROMPT_CACHE_BYTES=0)"
    share = f"{100 * i.prompt_tokens_cached / i.prompt_tokens_total:.0f} %" if i.prompt_tokens_total else "-"
    return (f"  prefix cache {i.prompt_cache_entries} entries, {_size(i.prompt_cache_bytes)} of "
            f"{_size(i.prompt_cache_budget)} per rank; {i.prompt_cache_hits} hits, {i.prompt_cache_misses} misses, "
            f"{i.prompt_cache_evictions} evictions; {share} of prompt tokens from the cache")


def _prompt_cache_disk(i: Info) -> str:
    if not i.prompt_cache_disk_cap_bytes:
        return "  disk cache off (PROMPT_CACHE_DISK_BYTES=0, the prefix cache off, or still opening)"
    return (f"  disk cache {i.prompt_cache_disk_entries} entries, {_size(i.prompt_cache_disk_bytes)} of "
            f"{_size(i.prompt_cache_disk_cap_bytes)} on rank 0; {i.prompt_cache_disk_hits} hits, "
            f"{i.prompt_cache_disk_restores} restores, {i.prompt_cache_disk_restore_failures} restore failures, "
            f"restore rate {_restore_rate(i)}; {i.prompt_cache_disk_writes} writes, "
            f"{i.prompt_cache_disk_evictions} evictions")


def _restore_rate(i: Info) -> str:
    """Bytes read back per second spent reading, checking and rebuilding ("–" before the first restore)."""
    if not (i.prompt_cache_disk_bytes_restored and i.prompt_cache_disk_seconds_restoring):
        return "–"
    return _rate(i.prompt_cache_disk_bytes_restored / i.prompt_cache_disk_seconds_restoring)


def _speculative(i: Info) -> str:
    if i.spec_mode == "off":
        return "  speculation off (SPECULATIVE=off, or the model's caches cannot verify drafts: see the engine log)"
    if not i.spec_forward_passes:
        return f"  speculation {i.spec_mode}, up to {i.spec_draft_tokens} draft tokens; no drafts verified yet"
    accepted = 100 * i.spec_accepted_tokens / i.spec_proposed_tokens if i.spec_proposed_tokens else 0
    return (f"  speculation {i.spec_mode}, up to {i.spec_draft_tokens} draft tokens; {i.spec_accepted_tokens} of "
            f"{i.spec_proposed_tokens} proposed tokens accepted ({accepted:.0f} %), "
            f"{i.spec_emitted_tokens / i.spec_forward_passes:.2f} tokens per forward pass with drafts")


def _kv_memory(i: Info) -> str:
    if not i.kv_budget_bytes:
        return f"  KV memory no limit (KV_MEMORY_BYTES=0, or the engine could not size it: see its log){_precision(i)}"
    held = i.kv_reserved_bytes + i.prompt_cache_bytes
    return (f"  KV memory {_size(i.kv_reserved_bytes)} reserved by running sequences + {_size(i.prompt_cache_bytes)} "
            f"prefix cache of {_size(i.kv_budget_bytes)} per rank ({100 * held / i.kv_budget_bytes:.0f} %); "
            f"{_per_sequence(i)}{_precision(i)}")


def _precision(i: Info) -> str:
    """How keys and values are stored, and the setting that chose it ("" from an engine older than the field)."""
    if not i.kv_precision:
        return ""
    setting = f"KV_BITS={i.kv_bits}, KV_GROUP_SIZE={i.kv_group_size}" if i.kv_bits else "KV_BITS=off"
    return f"; keys and values in {i.kv_precision} ({setting})"


def _per_sequence(i: Info) -> str:
    """What one sequence takes per rank: bytes per token, the window part, the constant part."""
    parts = [f"{i.kv_token_bytes} bytes per token"]
    if i.kv_window_token_bytes:
        parts.append(f"{i.kv_window_token_bytes} bytes per token of a {i.kv_window}-token window")
    if i.kv_constant_bytes:
        parts.append(f"{i.kv_constant_bytes} bytes of state per sequence")
    return " + ".join(parts) + ("" if i.kv_measured else " (from the config: the caches were not measured)")


def describe_failures(layout: Layout, pid: int) -> str:
    """What the engine's supervisor (pid) recorded about failed ranks and restarts; "" when nothing."""
    s = read_state(state_path(layout.run_dir), pid)
    if s is None:
        return ""
    f = s.last_failure
    out = []
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.time)) if f else ""
    if s.state == "restarting" and f:
        wait = max(0.0, (s.next_restart_at or 0) - time.time())
        out.append(f"  RESTARTING in {wait:.0f}s (ENGINE_RESTART=always): at {when} {f.summary}")
    elif s.state == "starting" and s.restarts and f:
        out.append(f"  RESTARTING now (restart {s.restarts}, ENGINE_RESTART=always): at {when} {f.summary}")
    elif f:
        out.append(f"  last failure  at {when}: {f.summary}")
    if f and f.detail:
        out.append(f"                its last words: {f.detail}")
    if f and f.hint:
        out.append(f"                what it means: {f.hint}")
    if s.restarts:
        out.append(f"  restarts      {s.restarts} since start (ENGINE_RESTART={s.restart})")
    return "\n".join(out)


def _engine_dead(layout: Layout, pid: int) -> list[str]:
    failures = describe_failures(layout, pid)
    state = read_state(state_path(layout.run_dir), pid)
    if state is not None and state.state in ACTIVE:
        # The supervisor never recorded an end: it was killed, and the engine ended with it.
        out = [f"engine   DEAD: its supervisor (pid {pid}) was killed or crashed without recording why, and the engine",
               "         stopped with it (nothing restarts it, whatever ENGINE_RESTART says): run ./launch.sh start"]
        out += [failures] if failures else []
    elif failures:
        out = [f"engine   DEAD: a rank failed and the engine ended (process group {pid} is gone)", failures]
    else:
        out = [f"engine   DEAD: process group {pid} is gone but its pid file remains (crashed, or ended by the watchdog)"]
    out.append(f"         last lines of {layout.engine_log}:")
    try:
        out += [f"         | {line}" for line in layout.engine_log.read_text(errors="replace").splitlines()[-5:]]
    except OSError:
        pass
    return out


def stale_note(name: str, pids: PidFile) -> tuple[int | None, list[str]]:
    """The recorded group while it is ours; a pid file naming another program is removed (never signalled)."""
    record, pid, why = pids.judge()
    if pid is None and why not in ("", "not running"):
        pids.drop(record)
        return None, [f"{name} removed the stale pid file {pids.path}: {why}"]
    return pid, []


def engine_status(layout: Layout, engine: EngineCtl) -> tuple[str, list[str]]:
    pid, notes = stale_note("engine  ", engine.pids)
    state, lines = _engine_status(layout, engine, pid)
    return state, notes + lines


def _engine_status(layout: Layout, engine: EngineCtl, pid: int | None) -> tuple[str, list[str]]:
    s = layout.settings
    if pid is not None and not process_alive(pid):
        return "unsupervised", [
            f"engine   UNSUPERVISED: its supervisor (pid {pid}) is gone, yet processes of its group still run",
            "         nothing restarts the engine or ends it when a rank fails (ENGINE_RESTART no longer applies),",
            "         and its output reaches no log: run ./launch.sh restart-engine"]
    info = engine.info()
    if pid is not None and info is not None:
        return "up", [f"engine   running, rank 0 answering   process group {pid}   socket {s.socket_path}",
                      describe_info(info), *filter(None, [describe_failures(layout, pid)])]
    if pid is not None:
        return "degraded", [
            f"engine   running but rank 0 NOT answering (still loading, restarting, or hung)   process group {pid}",
            f"         model {s.MODEL}, hosts {s.HOSTFILE or s.HOSTS}; see {layout.engine_log}",
            *filter(None, [describe_failures(layout, pid)])]
    recorded = engine.pids.read()
    if recorded is not None:
        return "dead", _engine_dead(layout, recorded)
    if info is not None:
        return "foreign", [f"engine   an engine not started by this launch.sh answers on {s.socket_path}",
                           describe_info(info)]
    return "stopped", ["engine   stopped"]


FROZEN = "is STOPPED (SIGSTOP): it takes connections on port {port} but answers none"


def api_status(layout: Layout, api: ApiCtl) -> tuple[str, list[str]]:
    pid, notes = stale_note("api     ", api.pids)
    if pid is not None:
        return _running_api(layout, api, pid, "")
    recorded = api.pids.read()
    if recorded is not None:
        return "dead", [f"api      DEAD: pid {recorded} is gone but its pid file remains; see {layout.api_log}"]
    handed = _handed_over_api(layout)
    if handed is not None:
        # A restart-api moved api.pid aside and has not yet written the new API's: the old one still serves.
        return _running_api(layout, api, handed, " (a restart-api is handing it over)")
    return "stopped", [*notes, "api      stopped"]


def _running_api(layout: Layout, api: ApiCtl, pid: int, note: str) -> tuple[str, list[str]]:
    if group_frozen(pid):
        return "degraded", [f"api      process group {pid} {FROZEN.format(port=layout.settings.API_PORT)}; "
                            "./launch.sh restart-api or stop kills it"]
    code = api.health()
    if code == "200":
        return "up", [f"api      running   pid {pid}   {layout.api_url}   (/health 200){note}"]
    return "degraded", [f"api      running but /health answers {code}   pid {pid}   {layout.api_url}{note}"]


def _handed_over_api(layout: Layout) -> int | None:
    """The group of an API a restart-api is handing over (moved aside, not yet told to stop) that lives."""
    for path in layout.draining_files():
        record = PidFile(path).record()
        if _handing_over(record):
            return record.pid
    return None


def _handing_over(record: Record | None) -> bool:
    """The record of an API being handed over (recorded by us, not yet told to stop) whose group lives."""
    return record is not None and record.handing_over and record.pid > 1 and group_alive(record.pid)


def draining_status(layout: Layout, api: ApiCtl) -> tuple[bool, list[str]]:
    """The APIs restart-api replaced that still run; False when one is long past its drain deadline."""
    fine, lines = True, []
    s = layout.settings
    for path in layout.draining_files():
        pids = PidFile(path)
        record, pid, why = pids.judge()
        if pid is None and why not in ("", "not running") and _handing_over(record):
            # A restart-api's hand-over under way: it moves this file back or on; only it, or the next
            # locked command, may judge it (a status that removed it would leave that restart-api no API).
            pid = record.pid
        if pid is None:
            if why == "not running":
                pids.drop(record)  # it drained and ended: nothing to report
            else:
                lines += stale_note("api     ", pids)[1]
            continue
        drain = api.drain_of(record)
        if group_frozen(pid):
            fine = False
            lines.append(f"api      previous API (process group {pid}), replaced by restart-api, "
                         f"{FROZEN.format(port=s.API_PORT)}; ./launch.sh start, stop, restart, restart-engine or "
                         "restart-api kills it")
            continue
        if record.handing_over:
            lines.append(f"api      previous API (process group {pid}) being replaced by a restart-api (if none runs, "
                         "the next start, stop, restart, restart-engine or restart-api finishes the hand-over)")
            continue
        late = api.overdue(pids, OVERDUE_SLACK)
        if late is None:
            lines.append(f"api      previous API (process group {pid}), replaced by restart-api, finishing its open "
                         f"requests (API_DRAIN_TIMEOUT={drain:g}s)")
            continue
        fine = False
        lines += [f"api      previous API (process group {pid}), replaced by restart-api, STILL RUNS {late:.0f}s past its "
                  f"drain deadline (API_DRAIN_TIMEOUT={drain:g}s + {API_STOP_GRACE}s): hung or frozen,",
                  f"         it may still take connections on port {s.API_PORT}; ./launch.sh start, stop, restart, "
                  "restart-engine or restart-api kills it"]
    return fine, lines


def status(layout: Layout) -> int:
    engine_state, lines = engine_status(layout, EngineCtl(layout))
    api_state, more = api_status(layout, ApiCtl(layout))
    lines += more
    drains_fine, more = draining_status(layout, ApiCtl(layout))
    lines += more
    lines.append(f"logs     {layout.engine_log}   {layout.api_log}")
    print("\n".join(lines), flush=True)
    if engine_state == "up" and api_state == "up" and drains_fine:
        return UP
    if engine_state == "stopped" and api_state == "stopped" and drains_fine:
        return STOPPED
    return PARTLY
