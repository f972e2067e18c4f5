"""`./launch.sh check` on Macs, without a Mac: the probe reads macOS's commands through an injected runner fed
the output those commands print on a Mac (sw_vers, rdma_ctl, ibv_devinfo, ifconfig, pmset, sysctl), and the
check turns what it finds into one sentence per fault, each with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import REPO_ROOT, load_settings
from ops import cluster, hostprobe, macfacts
from ops.cluster import Host

GiB = 1 << 30
SW_VERS = "ProductName:\t\tmacOS\nProductVersion:\t\t{v}\nBuildVersion:\t\t25D125\n"
IBV_DEVINFO = """hca_id:\trdma_en3
\ttransport:\t\t\tThunderbolt (100)
\tfw_ver:\t\t\t\t0.0.0
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
hca_id:\trdma_en4
\ttransport:\t\t\tThunderbolt (100)
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_DOWN (1)
"""
IFCONFIG = """lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384
\toptions=1203<RXCSUM,TXCSUM,TXSTATUS,SW_TIMESTAMP>
\tinet 127.0.0.1 netmask 0xff000000
\tinet6 ::1 prefixlen 128
en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tether 00:3e:e1:bf:11:c7
\tinet6 fe80::23e:e1ff:febf:11c7%en0 prefixlen 64 secured scopeid 0x4
\tinet 192.168.1.{host} netmask 0xffffff00 broadcast 192.168.1.255
\tstatus: active
en3: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\toptions=460<TSO4,TSO6,CHANNEL_IO>
\tether 36:8f:ab:12:40:04
{en3_inet}\tmedia: autoselect <full-duplex>
\tstatus: active
bridge0: flags={bridge_flags} mtu 1500
\toptions=63<RXCSUM,TXCSUM,TSO4,TSO6>
\tether 36:8f:ab:12:40:00
\tConfiguration:
\t\tid 0:0:0:0:0:0 priority 0 hellotime 0 fwddelay 0
\t\tipfilter disabled flags 0x0
\tmember: en3 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 9 priority 0 path cost 0
\tmedia: <unknown type>
\tstatus: inactive
"""
PMSET = """System-wide power settings:
Currently in use:
 standby              0
 Sleep On Power Button 1
 hibernatefile        /var/vm/sleepimage
 powernap             1
 disksleep            10
 sleep                {sleep} (sleep prevented by sharingd, powerd)
 hibernatemode        0
 displaysleep         10
 womp                 1
"""


def mac(macos="26.3", rdma="enabled", ibv=IBV_DEVINFO, ibv_status="ok", en3_inet=True, bridge_up=False, sleep=0,
        memsize=64 * GiB, wired_mb=0, working_set=0, python3="3.9.6", host=11):
    """A runner answering as a Mac does: each command's real output, shaped by the arguments."""
    inet = "\tinet 192.168.0.1 netmask 0xfffffffc broadcast 192.168.0.3\n" if en3_inet else ""
    flags = "8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST>" if bridge_up else "8822<BROADCAST,SMART,SIMPLEX,MULTICAST>"
    answers = {
        "sw_vers": ("ok", SW_VERS.format(v=macos)),
        "rdma_ctl": ("ok", f"{rdma}\n"),
        "ibv_devinfo": (ibv_status, ibv if ibv_status == "ok" else ""),
        "ifconfig": ("ok", IFCONFIG.format(host=host, en3_inet=inet, bridge_flags=flags)),
        "pmset": ("ok", PMSET.format(sleep=sleep)),
        "hw.memsize": ("ok", f"{memsize}\n"),
        "iogpu.wired_limit_mb": ("ok", f"{wired_mb}\n"),
        "python3": ("ok", f"{python3}\n"),
        "python": ("ok", f"{working_set}\n"),
    }

    def run(argv: list[str], timeout: float) -> tuple[str, str]:
        key = argv[-1] if argv[0] == "sysctl" else Path(argv[0]).name
        return answers.get(key, ("missing", ""))
    return run


def facts(run, model_bytes=40 * GiB, venv=True, reach=None, root=REPO_ROOT, home=Path("/Users/me")) -> dict:
    """One host's facts as ops/hostprobe.py reports them, its system part read through run."""
    f = {"hostname": "mac", "python": "3.12.8", "executable": "/Users/me/mcs/.venv/bin/python", "venv": venv,
         "mlx": "0.32.4", "mlx_lm": "0.32.2", "project": True, "code": "c0de", "env": None,
         "model": {"ok": True, "identity": "config.json 3f0c", "bytes": model_bytes}}
    f |= hostprobe.system_facts(Path(root), (), "", run, "Darwin", home)
    f["reach"] = reach or {}
    return f


@pytest.fixture
def settings(tmp_path):
    def make(**env: str):
        hostfile = tmp_path / "hosts.json"
        hostfile.write_text(json.dumps({"backend": "jaccl", "hosts": [
            {"ssh": "mac-1.local", "ips": ["192.168.1.11"], "rdma": [None, "rdma_en3"]},
            {"ssh": "mac-2.local", "ips": ["192.168.1.12"], "rdma": ["rdma_en3", None]}]}))
        (tmp_path / "empty.env").touch()
        return load_settings({"BACKEND": "jaccl", "HOSTFILE": str(hostfile), "MODEL": "mlx-community/Big-4bit",
                              **env}, tmp_path / "empty.env")
    return make


def two_macs(s, first: dict, second: dict) -> list[Host]:
    hosts, faults = cluster.cluster_hosts(s)
    assert not faults and [h.ips for h in hosts] == [["192.168.1.11"], ["192.168.1.12"]]
    hosts[0].facts, hosts[1].facts = first, second
    cluster.judge(hosts, s, environ={})
    return hosts


def test_a_healthy_pair_of_macs_passes(settings):
    hosts = two_macs(settings(), facts(mac()), facts(mac(host=12), reach={"192.168.1.11:32323": "ok"}))
    assert [h.faults for h in hosts] == [[], []]


def test_each_mac_fault_is_one_sentence_with_its_fix(settings):
    s = settings(KV_MEMORY_BYTES=str(20 * GiB))
    second = mac(macos="26.2", rdma="disabled", en3_inet=False, bridge_up=True, sleep=10, memsize=64 * GiB,
                 host=12)
    hosts = two_macs(s, facts(mac(), model_bytes=80 * GiB),
                     facts(second, model_bytes=80 * GiB, reach={"192.168.1.11:32323": "EHOSTUNREACH",
                                                                "192.168.1.11:32322": "timeout"}))
    faults = hosts[1].faults
    expect = ["macOS 26.2 runs JACCL but fails its large frames: update this Mac to macOS 26.3",
              "macOS 26.2 differs from rank 0's 26.3: update every Mac to the same release",
              "RDMA over Thunderbolt is disabled here: start this Mac in macOS Recovery",
              "en3 (behind rdma_en3) has no IPv4 address, so JACCL finds no GID for it: run mlx.distributed_config",
              "en3 (behind rdma_en3) is in bridge0, which is up: run sudo ifconfig bridge0 deletem en3",
              "this Mac sleeps after 10 idle minute(s), and a sleeping Mac drops its link: run sudo pmset -a sleep 0",
              "this Mac cannot reach rank 0 at 192.168.1.11:32323 (EHOSTUNREACH): allow Local Network access",
              "rank 0 at 192.168.1.11:32322 did not accept a connection from here (timeout): let rank 0's venv Python "
              "through its firewall (sudo /usr/libexec/ApplicationFirewall/socketfilterfw --add",
              "rank(s) 1 need 40.0 GB of weights and 20.0 GB of KV (KV_MEMORY_BYTES), more than the 48.0 GB Metal "
              "lets this Mac wire (about 3/4 of its 64 GB of RAM): lower KV_MEMORY_BYTES, add a Mac or serve a "
              "smaller quantization, or raise the limit: sudo sysctl iogpu.wired_limit_mb=57344"]
    assert len(faults) == len(expect), faults
    for fault, start in zip(faults, expect):
        assert fault.startswith(start), fault
        assert fault.count(". ") == 0 and ": " in fault  # one sentence, then its fix


def test_metal_figures_come_first_from_mlx_then_the_sysctl_then_ram(settings):
    s = settings()
    for run, fits in ((mac(memsize=64 * GiB, working_set=60 * GiB), True),  # MLX's own figure, as budgets use
                      (mac(memsize=64 * GiB, wired_mb=58 * 1024), True),  # raised by iogpu.wired_limit_mb
                      (mac(memsize=64 * GiB), False)):  # 48 GB: 3/4 of RAM
        hosts = two_macs(s, facts(mac(memsize=128 * GiB), model_bytes=110 * GiB), facts(run, model_bytes=110 * GiB))
        assert any("Metal lets this Mac wire" in f for f in hosts[1].faults) is not fits, hosts[1].faults


def test_macos_too_old_for_jaccl_and_ibv_devinfo_missing_or_hung(settings):
    s = settings()
    old = two_macs(s, facts(mac()), facts(mac(macos="15.6.1", rdma="missing", ibv_status="missing")))[1].faults
    assert old[0].startswith("macOS 15.6.1 has no RDMA over Thunderbolt, which BACKEND=jaccl needs: update")
    assert any(f.startswith("ibv_devinfo is missing, which BACKEND=jaccl needs") for f in old)
    assert not any("RDMA over Thunderbolt is" in f for f in old)  # the release says it already
    hung = two_macs(s, facts(mac()), facts(mac(ibv_status="timeout")))[1].faults
    assert hung == ["ibv_devinfo did not answer within 10 s: the RDMA driver is stuck (most often after a crashed "
                    "JACCL job); restart this Mac"]


def test_a_down_port_names_its_device(settings):
    hosts = two_macs(settings(), facts(mac()), facts(mac()))
    assert hosts[0].faults == []
    bad = settings()
    hosts, _ = cluster.cluster_hosts(bad)
    hosts[1].rdma = [["rdma_en4", None]]
    hosts[0].facts, hosts[1].facts = facts(mac()), facts(mac())
    cluster.judge(hosts, bad, environ={})
    assert hosts[1].faults[0] == "RDMA device rdma_en4 is PORT_DOWN, not PORT_ACTIVE"


def test_a_checkout_in_a_folder_macos_hides_from_ssh(settings):
    root = Path("/Users/me/Documents/mlx-cluster-serve")
    f = facts(mac(), root=root)
    assert f["hidden"] == "Documents"
    assert macfacts.hidden_folder(Path("/Users/me/Library/Mobile Documents/com~apple~CloudDocs/mcs"),
                                  Path("/Users/me")) == "Library/Mobile Documents"
    assert macfacts.hidden_folder(Path("/Users/me/mlx-cluster-serve"), Path("/Users/me")) is None
    hosts = two_macs(settings(), facts(mac()), f)
    assert hosts[1].faults[0].startswith(f"the project {REPO_ROOT} is in ~/Documents, which macOS hides from ssh "
                                         "sessions: move the checkout")


def test_sync_needs_a_python_the_ssh_session_finds(settings):
    f = facts(mac(python3="3.9.6"), venv=False)
    assert f["setup_python"] == {"path": "python3", "version": "3.9.6", "ok": False}
    hosts = two_macs(settings(), facts(mac()), f)
    assert any(x.startswith("an ssh session here finds no Python >= 3.10 (python3 is 3.9.6), so ./launch.sh sync "
                            "cannot set it up: install one") for x in hosts[1].faults), hosts[1].faults
    homebrew = mac(python3="3.9.6")
    found = macfacts.setup_python(lambda argv, t: ("ok", "3.12.8\n") if argv[0] == "/opt/homebrew/bin/python3"
                                  else homebrew(argv, t))
    assert found == {"path": "/opt/homebrew/bin/python3", "version": "3.12.8", "ok": True}  # as launch.sh finds it


def test_each_host_resolves_its_own_model_cache(tmp_path):
    """check hands each host the cache setting as written (and the HF_* variables a rank gets), never rank 0's
    home: a remote Mac's ~ is its own."""
    (tmp_path / "empty.env").touch()
    s = load_settings({"HOSTS": "127.0.0.1,mac-2.local", "HUB_CACHE": "~/hub"}, tmp_path / "empty.env")
    host = Host("mac-2.local", [1])
    args = cluster.probe_args(host, s, (), {"HF_HOME": "/Volumes/models/hf"})
    assert args[args.index("--hub-cache") + 1] == "~/hub"
    assert "--env" in args and args[args.index("--env") + 1] == "HF_HOME=/Volumes/models/hf"
    unset = load_settings({"HOSTS": "127.0.0.1,mac-2.local"}, tmp_path / "empty.env")
    assert "--hub-cache" not in cluster.probe_args(host, unset, (), {})  # the host's own huggingface_hub default
    home = tmp_path / "home"
    out = subprocess.run([sys.executable, str(cluster.PROBE), "--root", str(REPO_ROOT), "--model", "org/none",
                          "--hub-cache", "~/hub", "--list-models"], capture_output=True, text=True,
                         env={**os.environ, "HOME": str(home)}, timeout=60)
    assert list(json.loads(out.stdout)["caches"]) == [str(home / "hub")]


def test_the_shipped_probe_runs_as_one_script(tmp_path):
    out = subprocess.run([sys.executable, "-", "--root", str(tmp_path), "--model", "demo-tiny"],
                         input=cluster.shipped_probe(), capture_output=True, timeout=60)
    got = json.loads(out.stdout)
    assert got["project"] is False and got["system"] and "setup_python" in got


def test_reach_names_the_errno():
    def refuse(address, timeout):
        raise ConnectionRefusedError(111 if sys.platform != "darwin" else 61, "refused")
    assert macfacts.reach("192.168.1.11:32323", connect=refuse) == "ECONNREFUSED"

    def unreachable(address, timeout):
        raise OSError(65 if sys.platform == "darwin" else 113, "No route to host")
    assert macfacts.reach("[fe80::1]:32323", connect=unreachable) == "EHOSTUNREACH"
    assert macfacts.reach("10.0.0.1:1", connect=lambda a, t: None) == "ok"


def test_a_command_that_hangs_is_cut_off(tmp_path):
    """ibv_devinfo hangs while the RDMA driver is wedged: the probe must answer anyway, saying so."""
    hang = tmp_path / "ibv_devinfo"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    assert macfacts.run_command([str(hang)], 0.2) == ("timeout", "")
    assert macfacts.run_command([str(tmp_path / "absent")], 1) == ("missing", "")
