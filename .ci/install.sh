#!/usr/bin/env bash
# .ci/install.sh NAME PATH_OR_COMMAND WHAT: install Debian's package NAME unless PATH_OR_COMMAND is already there.
# Where it cannot be installed, WHAT (the tests that drive it) would be skipped: that is a note on a developer's
# machine, and a failure under CI=true, so that a CI run can never pass green without those tests.
set -uo pipefail
name=$1 probe=$2 what=$3

present() { [[ -x $probe ]] || command -v "$probe" >/dev/null 2>&1; }

if present; then
    echo "present: $name"
    exit 0
fi
why="no apt-get"
if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo -n"
    if $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$name" >/dev/null &&
        present; then
        echo "installed: $name"
        exit 0
    fi
    why="apt-get install $name failed"
fi
if [[ ${CI:-} == true ]]; then
    echo "could not install $name ($why): CI=true needs it for $what; install it (apt-get install $name) or fix the" \
        "package source" >&2
    exit 1
fi
echo "could not install $name ($why): $what will be skipped"
