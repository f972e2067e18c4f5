"""What a host says about itself beyond Python: macOS's own commands, the Python an ssh session finds, the way to
rank 0. Facts only, as JSON-ready values; ops/mac_check.py decides what is a fault.

Standard library only: `./launch.sh check` ships this file with ops/hostprobe.py to every host (ops/cluster.py).
Every command's output comes through `run`, so tests feed the output the real commands print on a Mac.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

# run(argv, timeout) -> (status, stdout): status is "ok", "missing" (not installed), "timeout" or "failed"
Runner = Callable[[list[str], float], tuple[str, str]]
COMMAND_TIMEOUT = 10.0  # seconds; ibv_devinfo hangs while the RDMA driver is wedged
# launch.sh setup's own search for a Python >= 3.10 when PYTHON is not set: these names on PATH, then in these folders
SETUP_PYTHONS = ("python3", "python3.14", "python3.13", "python3.12", "python3.11", "python3.10")
SETUP_FOLDERS = ("", "/opt/homebrew/bin", "/usr/local/bin", "/Library/Frameworks/Python.framework/Versions/Current/bin")
# folders macOS keeps from processes started by sshd (TCC) unless it has Full Disk Access
HIDDEN_FOLDERS = ("Desktop", "Documents", "Downloads", "Library/Mobile Documents", "Library/CloudStorage")
# what mlx-lm's pipeline split and our budgets read: Metal's working set (engine/ranks.py)
WORKING_SET = "import mlx.core as mx; print(int(mx.device_info().get('max_recommended_working_set_size') or 0))"


def run_command(argv: list[str], timeout: float) -> tuple[str, str]:
    if shutil.which(argv[0]) is None:
        return "missing", ""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
    except OSError:
        return "missing", ""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.stdout.close()
        try:
            proc.wait(1)  # one stuck in the RDMA driver may not even die: never wait longer for it
        except subprocess.TimeoutExpired:
            pass
        return "timeout", ""
    return ("ok" if proc.returncode == 0 else "failed"), out


def macos_version(run: Runner) -> str | None:
    """ProductVersion as `sw_vers` prints it (e.g. 26.2)."""
    status, out = run(["sw_vers"], COMMAND_TIMEOUT)
    m = re.search(r"ProductVersion:\s*(\S+)", out) if status == "ok" else None
    return m.group(1) if m else None


def rdma_ctl(run: Runner) -> str:
    """"enabled", "disabled", "missing" (macOS before 26.2), or what `rdma_ctl status` said instead."""
    status, out = run(["rdma_ctl", "status"], COMMAND_TIMEOUT)
    if status == "missing":
        return "missing"
    text = out.strip().lower()
    return "disabled" if "disabled" in text else "enabled" if "enabled" in text else (text or status)[:80]


def ibv_ports(run: Runner) -> dict:
    """{"status": "ok" | "missing" | "timeout" | "failed", "ports": {device: port state}} from ibv_devinfo."""
    status, out = run(["ibv_devinfo"], COMMAND_TIMEOUT)
    ports: dict[str, str] = {}
    device = None
    for line in out.splitlines():
        if m := re.match(r"\s*hca_id:\s*(\S+)", line):
            device = m.group(1)
        elif (m := re.match(r"\s*state:\s*(\S+)", line)) and device is not None:
            if ports.get(device) != "PORT_ACTIVE":  # a device with several ports is active when any is
                ports[device] = m.group(1)
    return {"status": status, "ports": ports}


def interfaces(run: Runner) -> dict[str, dict]:
    """{name: {"up": bool, "inet": [IPv4 addresses], "members": [bridge members]}} from `ifconfig`."""
    status, out = run(["ifconfig"], COMMAND_TIMEOUT)
    found: dict[str, dict] = {}
    current: dict | None = None
    for line in out.splitlines() if status == "ok" else []:
        if m := re.match(r"^(\S+?):\s+flags=\w+<([^>]*)>", line):
            current = found[m.group(1)] = {"up": "UP" in m.group(2).split(","), "inet": [], "members": []}
        elif current is not None and (m := re.match(r"\s+inet\s+(\d+\.\d+\.\d+\.\d+)", line)):
            current["inet"].append(m.group(1))
        elif current is not None and (m := re.match(r"\s+member:\s+(\S+)", line)):
            current["members"].append(m.group(1))
    return found


def sleep_minutes(run: Runner) -> int | None:
    """The system sleep timer `pmset -g` reports (0: never sleeps), None where pmset says nothing."""
    status, out = run(["pmset", "-g"], COMMAND_TIMEOUT)
    m = re.search(r"^\s*sleep\s+(\d+)", out, re.MULTILINE) if status == "ok" else None
    return int(m.group(1)) if m else None


def sysctl_int(run: Runner, name: str) -> int | None:
    status, out = run(["sysctl", "-n", name], COMMAND_TIMEOUT)
    return int(out.strip()) if status == "ok" and out.strip().isdigit() else None


def working_set(run: Runner, python: Path) -> int | None:
    """Bytes Metal lets the GPU wire, as this host's MLX reports it; None where MLX cannot say."""
    if not python.exists():
        return None
    status, out = run([str(python), "-c", WORKING_SET], 60.0)
    return int(out.strip()) or None if status == "ok" and out.strip().isdigit() else None


def mac_facts(run: Runner, python: Path) -> dict:
    """Everything the Darwin-only checks read."""
    return {"macos": macos_version(run), "rdma_ctl": rdma_ctl(run), "interfaces": interfaces(run),
            "sleep": sleep_minutes(run), "memsize": sysctl_int(run, "hw.memsize"),
            "wired_limit_mb": sysctl_int(run, "iogpu.wired_limit_mb"), "working_set": working_set(run, python)}


def setup_python(run: Runner, python: str = "") -> dict:
    """The Python `./launch.sh setup` would create .venv with on this host over ssh, as {"path", "version", "ok"}:
    PYTHON when given, else the first >= 3.10 it finds (PATH, then Homebrew's and python.org's folders), else
    python3 (ok false)."""
    first = None
    names = [python] if python else [f"{d}/{n}" if d else n for d in SETUP_FOLDERS for n in SETUP_PYTHONS]
    for name in names:
        status, out = run([name, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], 30.0)
        version = out.strip() if status == "ok" else None
        found = {"path": name, "version": version,
                 "ok": version is not None and tuple(map(int, version.split(".")[:2])) >= (3, 10)}
        if found["ok"]:
            return found
        first = first or found
    return first or {"path": python, "version": None, "ok": False}


def hidden_folder(root: Path, home: Path) -> str | None:
    """The folder of home that macOS hides from ssh sessions and that holds root, if one does."""
    for folder in HIDDEN_FOLDERS:
        if root == home / folder or (home / folder) in root.parents:
            return folder
    return None


def reach(address: str, timeout: float = 3.0,
          connect: Callable[[tuple[str, int], float], object] = socket.create_connection) -> str:
    """"ok" when a TCP connection to HOST:PORT opens, else why not (an errno name, or "timeout")."""
    host, _, port = address.rpartition(":")
    try:
        conn = connect((host.strip("[]"), int(port)), timeout)
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc)) if exc.errno else str(exc) or type(exc).__name__
    close = getattr(conn, "close", None)
    if close:
        close()
    return "ok"


def apply_env(pairs: list[str]) -> None:
    """NAME=VALUE pairs as mlx.launch's --env sets them for a rank (HF_HOME, HF_HUB_CACHE forwarded by rank 0)."""
    for pair in pairs:
        name, _, value = pair.partition("=")
        os.environ[name] = value
