"""A host name that ssh would read as an option (`-oProxyCommand=...` runs a command on this host) is refused
in HOSTS and in a HOSTFILE alike, and, should one get past that, every ssh ops runs ends its options with `--`
first: the real ssh then takes it for a (bad) host name and runs nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from config import ConfigError, load_settings
from config.hub_cache import Manifest

NO_ENV_FILE = Path("/nonexistent/.env")


def hostfile(tmp_path: Path, *names: str) -> str:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": name, "ips": []} for name in names]))
    return str(path)


@pytest.mark.parametrize("name", ["-oProxyCommand=touch /tmp/pwned", "-Elog", "admin@mac-2"])
def test_a_host_ssh_would_read_as_an_option_is_refused_in_hosts_and_in_a_hostfile(tmp_path, name):
    with pytest.raises(ConfigError, match="is not a host name or IP address"):
        load_settings({"HOSTS": f"127.0.0.1,{name}"}, NO_ENV_FILE)
    with pytest.raises(ConfigError) as refused:
        load_settings({"HOSTFILE": hostfile(tmp_path, "mac-1.local", name)}, NO_ENV_FILE)
    assert f"the ssh entry of rank 1, {name!r}, is not a host name or IP address" in str(refused.value)
    load_settings({"HOSTFILE": hostfile(tmp_path, "mac-1.local", "10.0.0.2", "fe80::1")}, NO_ENV_FILE)


def test_every_ssh_that_ops_runs_ends_its_options_before_the_host(tmp_path, monkeypatch):
    """Past the check (a Host built by hand), each call site's ssh, recorded by a stand-in: `--`, then the host.
    (OpenSSH 9.2 then refuses the name; an older one would run the ProxyCommand.)"""
    from ops import cluster, spread_rsync
    from ops.cluster import Host, run_probe, sync

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ssh").write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" >>{tmp_path}/argv; printf "\\n" >>{tmp_path}/argv\n'
                              "exit 255\n")
    (bin_ / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    evil = Host("-oProxyCommand=touch /tmp/pwned")
    facts, fault = run_probe(evil, [])
    assert facts is None and fault.startswith(f"ssh {evil.name} failed"), fault
    with pytest.raises(spread_rsync.SpreadError):
        spread_rsync._remote(evil.name, "check", tmp_path, Manifest(repo="org/x", revision="main", commit="0" * 40,
                                                                      files=()))
    monkeypatch.setattr(cluster, "cluster_hosts", lambda settings: ([evil], []))
    assert sync(load_settings({}, NO_ENV_FILE)) == 1
    calls = [line.split("\0")[:-1] for line in (tmp_path / "argv").read_text().splitlines()]
    assert len(calls) == 3
    for argv in calls:
        assert argv[argv.index(evil.name) - 1] == "--", argv


def test_rsync_ends_its_options_and_ssh_s_before_the_host_and_sends_paths_as_they_are(tmp_path):
    from ops.spread_rsync import rsync_command

    manifest = Manifest(repo="org/x", revision="main", commit="0" * 40, files=())
    argv = rsync_command("-oProxyCommand=x", tmp_path / "a", tmp_path / "b c", manifest)
    assert argv[argv.index("-e") + 1].endswith(" --")  # the remote shell: ssh ... -- HOST
    assert argv[-3] == "--" and argv[-1] == f"-oProxyCommand=x:{tmp_path}/b c/models--org--x/"
    assert "--protect-args" in argv
