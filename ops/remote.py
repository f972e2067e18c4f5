"""Every ssh and rsync command ops runs against another host, built in one place.

A host name never reaches ssh where it could be read as an option: `--` ends the options before it (a
HOSTFILE entry `-oProxyCommand=...` would otherwise run a command on this host; config refuses such names
too). rsync's remote paths travel unquoted under --protect-args: rsync then hands them over as they are,
where without it 3.2.4 and later escape them themselves and older ones let the remote shell split them at a
space, so no one quoting suits both.
"""

from __future__ import annotations

import shlex

SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
# rsync appends the host (and nothing else: config refuses user@ in host names) to its remote shell
RSYNC_SHELL = shlex.join(["ssh", *SSH_OPTIONS, "--"])


def ssh(host: str, command: str) -> list[str]:
    """ssh running command (one shell line) on host."""
    return ["ssh", *SSH_OPTIONS, "--", host, command]


def rsync(options: list[str], source: str, host: str, dest: str) -> list[str]:
    """rsync copying source (local) to dest on host, both paths as they are."""
    return ["rsync", "--protect-args", *options, "-e", RSYNC_SHELL, "--", source, f"{host}:{dest}"]
