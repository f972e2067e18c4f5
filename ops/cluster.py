"""`./launch.sh check|sync`: the cluster preflight and project sync.

check runs ops/hostprobe.py on every host (locally for 127.0.0.1/localhost, else over ssh),
compares what each reports with rank 0's host, prints a table with a verdict per host and
exits 1 on any fault. sync copies the project and .env to the remote hosts with rsync, then installs there
what the ranks need (`./launch.sh setup --runtime`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from config import REPO_ROOT, Settings
from ops import host_faults
from ops.helpers_check import helper_refusal
from ops.kvquant_check import kv_quant_refusal
from ops.parallel_check import parallel_verdict
from ops.rank0_ports import listening
from ops.remote import rsync, ssh
from ops.speculative_check import speculative_verdict

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
PROBE = Path(__file__).resolve().parent / "hostprobe.py"
MACFACTS = PROBE.parent / "macfacts.py"  # shipped with it
# what a rank resolves its Hugging Face cache from when HUB_CACHE is not set (forwarded to it by ops/rank_env.py)
HF_CACHE_VARS = ("HF_HOME", "HF_HUB_CACHE")
PROBE_TIMEOUT = 60  # seconds per host (ssh included)
# Never copied by sync (and, being excluded, never deleted on the other side either).
SYNC_EXCLUDES = (".venv/", ".git/", "run/", "logs/", ".cache/", "__pycache__/", "*.pyc", ".pytest_cache/", "node_modules/")


@dataclass
class Host:
    name: str
    ranks: list[int] = field(default_factory=list)
    rdma: list[list] = field(default_factory=list)  # this host's hostfile rdma row(s)
    ips: list[str] = field(default_factory=list)  # its hostfile ips (rank 0's first one: where the others dial it)
    facts: dict = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    @property
    def local(self) -> bool:
        return self.name in LOCAL_HOSTS


def cluster_hosts(settings: Settings) -> tuple[list[Host], list[str]]:
    """Hosts in rank order (merged when one host runs several ranks), and hostfile faults."""
    faults: list[str] = []
    names: list[str] = []
    rows: list = []
    ips: list[list[str]] = []
    if settings.HOSTFILE:
        path = Path(settings.HOSTFILE).expanduser()
        path = path if path.is_absolute() else REPO_ROOT / path
        try:
            doc = json.loads(path.read_text())
            entries = doc["hosts"] if isinstance(doc, dict) else doc
            names = [str(h["ssh"]) for h in entries]
            rows = [h.get("rdma") for h in entries]
            ips = [[str(ip) for ip in h.get("ips") or []] for h in entries]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [], [f"HOSTFILE {path} is not an mlx.launch hostfile ({type(exc).__name__}: {exc})"]
        if settings.BACKEND == "jaccl":
            faults += rdma_matrix_faults(rows)
    else:
        names = settings.hosts
    hosts: dict[str, Host] = {}
    for rank, name in enumerate(names):
        host = hosts.setdefault(name, Host(name))
        host.ranks.append(rank)
        if rows and isinstance(rows[rank], list):
            host.rdma.append(rows[rank])
        if ips and not host.ips:
            host.ips = ips[rank]
    return list(hosts.values()), faults


def rank_count(settings: Settings) -> int:
    """Ranks the engine runs: one per HOSTS entry, or per hostfile entry."""
    hosts, _ = cluster_hosts(settings)
    return sum(len(h.ranks) for h in hosts)


def rdma_matrix_faults(rows: list) -> list[str]:
    """The jaccl hostfile's rdma matrix must be n x n, null on the diagonal, a device elsewhere."""
    n = len(rows)
    faults = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != n:
            faults.append(f"hostfile rdma row of rank {i} must list {n} entries (one per host), got {row!r}")
            continue
        for j, cell in enumerate(row):
            if i == j:
                if cell is not None:
                    faults.append(f"hostfile rdma[{i}][{i}] must be null (a host has no link to itself), got {cell!r}")
            elif not _device_cell(cell):
                faults.append(f"hostfile rdma[{i}][{j}] must name the RDMA device from rank {i} to rank {j}, got {cell!r}")
    return faults


def _device_cell(cell: object) -> bool:
    if isinstance(cell, str):
        return bool(cell)
    return isinstance(cell, list) and bool(cell) and all(isinstance(c, str) and c for c in cell)


def _devices(cell: object) -> list[str]:
    return [cell] if isinstance(cell, str) else list(cell) if isinstance(cell, list) else []


def probe_host(host: Host, settings: Settings, reach: tuple[str, ...] = (),
               environ: Mapping[str, str] = os.environ) -> None:
    """Fill host.facts (or host.faults when the host cannot be probed)."""
    facts, fault = run_probe(host, probe_args(host, settings, reach, environ))
    if facts is None:
        host.faults.append(fault)
    else:
        host.facts = facts


def probe_args(host: Host, settings: Settings, reach: tuple[str, ...] = (),
               environ: Mapping[str, str] = os.environ) -> list[str]:
    """ops/hostprobe.py's arguments for host: the project, MODEL, each of its ranks' cache folder as the rank
    resolves it there (the setting as written, or the HF_* variables a rank gets forwarded), rank 0's ports to
    dial, and PYTHON as sync forwards it."""
    args = ["--root", str(REPO_ROOT), "--model", settings.MODEL]
    per_rank = settings.hub_caches_per_rank
    written = [per_rank[min(r, len(per_rank) - 1)] if per_rank else settings.HUB_CACHE for r in host.ranks]
    for cache in dict.fromkeys(c for c in written if c):  # each folder once; ~ and relative paths resolve there
        args += ["--hub-cache", cache]
    for name in HF_CACHE_VARS:
        if environ.get(name):
            args += ["--env", f"{name}={environ[name]}"]
    for address in reach:
        args += ["--reach", address]
    if environ.get("PYTHON"):
        args += ["--python", environ["PYTHON"]]
    return args


def shipped_probe() -> bytes:
    """ops/hostprobe.py with ops/macfacts.py, which it imports, as one script for `ssh HOST python -`."""
    helper, main = MACFACTS.read_text(), PROBE.read_text()
    return ("import sys, types\n"
            "_m = sys.modules['macfacts'] = types.ModuleType('macfacts')\n"
            f"exec(compile({helper!r}, 'macfacts.py', 'exec'), _m.__dict__)\n"
            f"exec(compile({main!r}, 'hostprobe.py', 'exec'), {{'__name__': '__main__'}})\n").encode()


def run_probe(host: Host, args: list[str]) -> tuple[dict | None, str]:
    """(what ops/hostprobe.py printed as JSON on host, "") or (None, why it could not run there)."""
    if host.local:
        cmd = [sys.executable, str(PROBE), *args]
        stdin = None
    else:
        venv = shlex.quote(str(REPO_ROOT / ".venv" / "bin" / "python"))
        remote = f'p={venv}; [ -x "$p" ] || p=python3; exec "$p" - {shlex.join(args)}'
        cmd = ssh(host.name, remote)
        stdin = shipped_probe()
    try:
        r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {PROBE_TIMEOUT} s" + ("" if host.local else " over ssh")
    except OSError as exc:
        return None, f"cannot run {cmd[0]}: {exc}"
    if r.returncode != 0:
        last = (r.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        how = "the probe failed" if host.local else f"ssh {host.name} failed (exit {r.returncode})"
        return None, f"{how}: {last}"
    try:
        return json.loads(r.stdout), ""
    except ValueError:
        return None, f"the probe printed something else than JSON: {r.stdout[:200]!r}"


def judge(hosts: list[Host], settings: Settings, environ: Mapping[str, str] = os.environ) -> None:
    """Add each host's faults: what it lacks, what differs from rank 0's host, and what its system says."""
    root = REPO_ROOT
    ref = hosts[0].facts if hosts and hosts[0].facts else {}
    for host in hosts:
        f = host.facts
        if not f:
            continue
        host.faults += host_faults.hidden_faults(f, str(root))
        if not f.get("project"):
            host.faults.append(f"the project is not at {root} (clone it there, or ./launch.sh sync)")
            host.faults += host_faults.python_faults(f, environ.get("PYTHON", ""))
            continue
        if not f.get("venv"):
            host.faults.append(f"no .venv in {root} (run ./launch.sh setup there)")
            host.faults += host_faults.python_faults(f, environ.get("PYTHON", ""))
        for key, name in (("mlx", "mlx"), ("mlx_lm", "mlx-lm")):
            if not f.get(key):
                host.faults.append(f"{name} is not installed for {f.get('executable')}")
        model = f.get("model") or {}
        if not model.get("ok"):
            host.faults.append(model.get("problem", "the model could not be checked"))
        if host is hosts[0]:
            continue
        for key, name in (("python", "Python"), ("mlx", "mlx"), ("mlx_lm", "mlx-lm")):
            if f.get(key) and ref.get(key) and f[key] != ref[key]:
                host.faults.append(f"{name} {f[key]} differs from rank 0's {ref[key]}")
        if ref.get("code") and f.get("code") != ref.get("code"):
            host.faults.append("project files differ from rank 0's (./launch.sh sync copies them)")
        if ref.get("project") and f.get("env") != ref.get("env"):
            host.faults.append(".env differs from rank 0's (./launch.sh sync copies it)")
        if model.get("ok") and (ref.get("model") or {}).get("ok") and model["identity"] != ref["model"]["identity"]:
            host.faults.append(f"the model differs from rank 0's ({model['identity']} vs {ref['model']['identity']})")
    jaccl = settings.BACKEND == "jaccl"
    for host, share in zip(hosts, host_faults.weight_shares(hosts, settings)):
        f = host.facts
        if not f:
            continue
        darwin = f.get("system") == "Darwin"
        host.faults += host_faults.macos_faults(f, None if host is hosts[0] else ref, jaccl)
        if jaccl:
            devices = list(dict.fromkeys(d for row in host.rdma for cell in row for d in _devices(cell)))
            host.faults += host_faults.rdma_faults(f, devices, darwin)
        host.faults += host_faults.power_faults(f) + host_faults.reach_faults(f)
        host.faults += host_faults.memory_faults(f, host.ranks, settings, share)


def render(hosts: list[Host], settings: Settings, global_faults: list[str],
           model_faults: list[str] | None = None, parallel: str = "", warnings: list[str] | None = None) -> str:
    head = ("host", "ranks", "python", "mlx", "mlx-lm", "model", "verdict")
    rows = []
    for h in hosts:
        f = h.facts
        model = (f.get("model") or {}).get("identity", "-") if f else "-"
        rows.append((h.name, ",".join(map(str, h.ranks)), f.get("python") or "-", f.get("mlx") or "-",
                     f.get("mlx_lm") or "-", model, "OK" if not h.faults else f"FAULT ({len(h.faults)})"))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [f"preflight: {len(hosts)} host(s), {sum(len(h.ranks) for h in hosts)} rank(s), backend {settings.BACKEND}, "
             f"model {settings.MODEL}, project {REPO_ROOT}", ""]
    if parallel:  # the mode the ranks will run MODEL in, and why when PARALLEL=auto could not get tensor
        lines[-1:-1] = [f"parallel: {parallel}"]
    for r in [head, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    faults = ([(h.name, x) for h in hosts for x in h.faults] + [("hostfile", x) for x in global_faults]
              + [("model", x) for x in model_faults or []])
    if warnings:  # it serves, but not as configured: said, never failed
        lines.append("")
        lines += [f"WARN model: {text}" for text in warnings]
    if faults:
        lines.append("")
        lines += [f"FAULT {name}: {text}" for name, text in faults]
        lines.append("")
        lines.append(f"preflight failed: {len(faults)} fault(s); fix them before ./launch.sh start")
    else:
        lines.append("")
        lines.append("preflight passed: every host is ready")
    return "\n".join(lines)


def check(settings: Settings) -> int:
    hosts, global_faults = cluster_hosts(settings)
    ranks = sum(len(h.ranks) for h in hosts)
    ports = (settings.doorbell_port, settings.RING_PORT)  # where the other ranks dial rank 0
    with listening(hosts[0].ips if hosts and settings.HOSTFILE and ranks > 1 else None, ports) as (reach, faults), \
            cf.ThreadPoolExecutor(len(hosts) + 4) as pool:
        global_faults += faults
        # the ranks together: can they run MODEL at all as PARALLEL says (asked here: mlx-lm decides alike anywhere)
        parallel = pool.submit(parallel_verdict, settings, ranks)
        speculation = pool.submit(speculative_verdict, settings)
        quantization = pool.submit(kv_quant_refusal, settings)
        helpers = pool.submit(helper_refusal, settings)
        list(pool.map(lambda h: probe_host(h, settings, reach), hosts))
    judge(hosts, settings)
    refusal, mode = parallel.result()
    spec_refusal, spec_warning = speculation.result()
    model_faults = [why for why in (refusal, spec_refusal, quantization.result(), helpers.result()) if why is not None]
    print(render(hosts, settings, global_faults, model_faults, mode, [spec_warning] if spec_warning else None))
    return 1 if global_faults or model_faults or any(h.faults for h in hosts) or not hosts else 0


def remote_setup(root: str, environ: Mapping[str, str] = os.environ) -> str:
    """The shell command that sets a synced host up: only what ranks need (no test extras), with PYTHON as set
    here; without it launch.sh looks for a Python >= 3.10 itself (an ssh session's PATH often finds only
    macOS's /usr/bin/python3, 3.9)."""
    python = f"PYTHON={shlex.quote(environ['PYTHON'])} " if environ.get("PYTHON") else ""
    return f"cd {shlex.quote(root)} && {python}./launch.sh setup --runtime"


def sync(settings: Settings) -> int:
    hosts, faults = cluster_hosts(settings)
    remote = [h for h in hosts if not h.local]
    if faults and not hosts:
        print("\n".join(faults), file=sys.stderr)
        return 1
    if not remote:
        print("sync: every host is local; nothing to copy")
        return 0
    root = str(REPO_ROOT)
    excludes = [f"--exclude={x}" for x in SYNC_EXCLUDES]
    for extra in (settings.run_dir, settings.log_dir):
        if extra.is_relative_to(REPO_ROOT) and extra != REPO_ROOT:
            excludes.append(f"--exclude=/{extra.relative_to(REPO_ROOT)}/")
    failed = 0
    for h in remote:
        print(f"sync: {root}/ -> {h.name}:{root}/")
        steps = [
            ssh(h.name, f"mkdir -p {shlex.quote(root)}"),
            rsync(["-az", "--delete", *excludes], f"{root}/", h.name, f"{root}/"),
            # the ranks run .venv/bin/python there: install or update it when pyproject.toml changed
            ssh(h.name, remote_setup(root)),
        ]
        for cmd in steps:
            if subprocess.run(cmd).returncode != 0:
                print(f"sync: {h.name}: {shlex.join(cmd[:2])} ... failed", file=sys.stderr)
                failed += 1
                break
    print("sync: done" if not failed else f"sync: {failed} host(s) failed", file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0
