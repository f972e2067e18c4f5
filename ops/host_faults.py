"""`./launch.sh check`, beyond versions and files: what macOS, the network, power and memory of each host must be
for its ranks to run, judged from what ops/macfacts.py found there. Each fault is one sentence with its fix.
"""

from __future__ import annotations

from collections.abc import Mapping

from config import Settings

JACCL_MACOS = (26, 2)  # RDMA over Thunderbolt arrived in macOS 26.2
LARGE_FRAMES_MACOS = (26, 3)  # JACCL's large frames need 26.3
MACOS_RESERVE_MB = 8192  # what the suggested iogpu.wired_limit_mb leaves macOS
WIRED_SHARE = 0.75  # about what Metal wires of RAM when iogpu.wired_limit_mb is 0 and MLX cannot say
FIREWALL = "/usr/libexec/ApplicationFirewall/socketfilterfw"
_GB = 1 << 30  # as Apple counts a Mac's "64 GB"


def version_tuple(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "").split("."))
    except ValueError:
        return ()


def macos_faults(facts: Mapping, ref: Mapping | None, jaccl: bool) -> list[str]:
    """The macOS release: new enough for JACCL, and the same as rank 0's."""
    version = (facts.get("mac") or {}).get("macos")
    faults = []
    if jaccl and version and version_tuple(version) < JACCL_MACOS:
        faults.append(f"macOS {version} has no RDMA over Thunderbolt, which BACKEND=jaccl needs: update this Mac to "
                      "macOS 26.3 or later (System Settings > General > Software Update), or set BACKEND=ring")
    elif jaccl and version and version_tuple(version) < LARGE_FRAMES_MACOS:
        faults.append(f"macOS {version} runs JACCL but fails its large frames: update this Mac to macOS 26.3 or later "
                      "(System Settings > General > Software Update)")
    theirs = ((ref or {}).get("mac") or {}).get("macos")
    if ref is not None and version and theirs and version != theirs:
        faults.append(f"macOS {version} differs from rank 0's {theirs}: update every Mac to the same release")
    return faults


def rdma_faults(facts: Mapping, devices: list[str], darwin: bool) -> list[str]:
    """JACCL's devices: RDMA enabled, ibv_devinfo answering, each device active, its interface addressed and
    out of the Thunderbolt bridge."""
    mac = facts.get("mac") or {}
    faults = []
    if darwin and mac.get("rdma_ctl") not in ("enabled", "missing"):  # missing: macos_faults says why
        faults.append(f"RDMA over Thunderbolt is {mac.get('rdma_ctl')} here: start this Mac in macOS Recovery (hold "
                      "the power button), open Utilities > Terminal, run rdma_ctl enable, and restart")
    ibv = facts.get("ibv") or {}
    if ibv.get("status") == "timeout":
        return [*faults, "ibv_devinfo did not answer within 10 s: the RDMA driver is stuck (most often after a "
                         "crashed JACCL job); restart this Mac"]
    if ibv.get("status") == "missing":
        return faults + (["ibv_devinfo is missing, which BACKEND=jaccl needs to find its devices: it ships in "
                          "/usr/bin from macOS 26.2 on, so update this Mac (26.3 or later)"] if darwin else [])
    ports = ibv.get("ports") or {}
    interfaces = mac.get("interfaces") or {}
    for dev in devices:
        state = ports.get(dev)
        if state != "PORT_ACTIVE":
            faults.append(f"RDMA device {dev} is {state or 'absent from ibv_devinfo'}, not PORT_ACTIVE")
        if not darwin or not dev.startswith("rdma_"):
            continue
        iface = dev.removeprefix("rdma_")
        if not (interfaces.get(iface) or {}).get("inet"):
            faults.append(f"{iface} (behind {dev}) has no IPv4 address, so JACCL finds no GID for it: run "
                          "mlx.distributed_config with --auto-setup again (docs/cluster.md), and make it last "
                          "over a restart as that page shows")
        bridges = [name for name, i in interfaces.items() if iface in i.get("members", []) and i.get("up")]
        for bridge in bridges:
            faults.append(f"{iface} (behind {dev}) is in {bridge}, which is up: run sudo ifconfig {bridge} "
                          f"deletem {iface}, and turn the Thunderbolt Bridge service off (docs/cluster.md)")
    return faults


def power_faults(facts: Mapping) -> list[str]:
    minutes = (facts.get("mac") or {}).get("sleep")
    if minutes:
        return [f"this Mac sleeps after {minutes} idle minute(s), and a sleeping Mac drops its link: "
                "run sudo pmset -a sleep 0"]
    return []


def wired_limit(facts: Mapping) -> tuple[int, str] | None:
    """(bytes Metal lets this Mac's GPU wire, where that figure comes from), None off a Mac."""
    mac = facts.get("mac") or {}
    if mac.get("working_set"):
        return mac["working_set"], "as MLX reports it"
    if mac.get("wired_limit_mb"):
        return mac["wired_limit_mb"] << 20, "iogpu.wired_limit_mb"
    if mac.get("memsize"):
        return int(mac["memsize"] * WIRED_SHARE), f"about 3/4 of its {mac['memsize'] / _GB:.0f} GB of RAM"
    return None


def memory_faults(facts: Mapping, ranks: list[int], settings: Settings, share: float) -> list[str]:
    """The weights this host's ranks hold (share of the model) and their KV budget, within Metal's wired limit."""
    limit = wired_limit(facts)
    weights = ((facts.get("model") or {}).get("bytes") or 0) * share
    if limit is None or not weights:
        return []
    kv = settings.KV_MEMORY_BYTES * len(ranks) if settings.KV_MEMORY_BYTES > 0 else 0
    if weights + kv <= limit[0]:
        return []
    memsize = (facts.get("mac") or {}).get("memsize") or 0
    raise_it = (f", or raise the limit: sudo sysctl iogpu.wired_limit_mb={(memsize >> 20) - MACOS_RESERVE_MB}"
                if memsize >> 20 > MACOS_RESERVE_MB else "")
    need = f"{weights / _GB:.1f} GB of weights" + (f" and {kv / _GB:.1f} GB of KV (KV_MEMORY_BYTES)" if kv else "")
    return [f"rank(s) {','.join(map(str, ranks))} need {need}, more than the {limit[0] / _GB:.1f} GB Metal lets "
            f"this Mac wire ({limit[1]}): {'lower KV_MEMORY_BYTES, ' if kv else ''}add a Mac or serve a smaller "
            f"quantization{raise_it}"]


def weight_shares(hosts: list, settings: Settings) -> list[float]:
    """The part of the model each host's ranks hold: tensor slices are equal; pipeline stages follow
    PIPELINE_LAYERS, else each host's wired limit (as the engine splits them)."""
    total = sum(len(h.ranks) for h in hosts) or 1
    if settings.PARALLEL == "pipeline" and total > 1:
        layers = settings.pipeline_layers
        if len(layers) == total:
            return [sum(layers[r] for r in h.ranks) / sum(layers) for h in hosts]
        limits = [(wired_limit(h.facts) or (0, ""))[0] for h in hosts]
        if all(limits):
            return [lim / sum(limits) for lim in limits]
    return [len(h.ranks) / total for h in hosts]


def python_faults(facts: Mapping, python: str) -> list[str]:
    """The Python sync's `./launch.sh setup --runtime` creates .venv with, where there is none yet."""
    found = facts.get("setup_python") or {}
    if facts.get("venv") or found.get("ok") or not found:
        return []
    seen = f"{found.get('path')} is {found['version']}" if found.get("version") else f"{found.get('path')} is missing"
    if python:
        return [f"PYTHON={python} cannot set this host up ({seen}): point PYTHON at a Python >= 3.10 on it"]
    return [f"an ssh session here finds no Python >= 3.10 ({seen}), so ./launch.sh sync cannot set it up: install "
            "one (brew install python@3.12) or run sync with PYTHON=/path/to/python3.12"]


def reach_faults(facts: Mapping) -> list[str]:
    """Rank 0's ports as this host's venv Python dials them (the macOS firewall, Local Network privacy)."""
    faults = []
    darwin = facts.get("system") == "Darwin"
    for address, result in (facts.get("reach") or {}).items():
        if result == "ok":
            continue
        if result == "EHOSTUNREACH" and darwin:
            faults.append(f"this Mac cannot reach rank 0 at {address} (EHOSTUNREACH): allow Local Network access "
                          f"for {facts.get('executable')} (System Settings > Privacy & Security > Local Network), "
                          "or fix the route to that address")
        else:
            faults.append(f"rank 0 at {address} did not accept a connection from here ({result}): let rank 0's "
                          f"venv Python through its firewall (sudo {FIREWALL} --add PYTHON --unblockapp PYTHON, "
                          "docs/cluster.md) and check that address is rank 0's")
    return faults


def hidden_faults(facts: Mapping, root: str) -> list[str]:
    folder = facts.get("hidden")
    if folder:
        return [f"the project {root} is in ~/{folder}, which macOS hides from ssh sessions: move the checkout "
                "out of it (e.g. to ~/mlx-cluster-serve) on every Mac"]
    return []
