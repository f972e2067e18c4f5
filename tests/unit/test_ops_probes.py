"""What ops asks of the host before it acts: is the model one this host can serve, are the ring's ports
free, and is a socket at SOCKET_PATH a stale one it may remove (never another program's file or live socket)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from config import REPO_ROOT, load_settings
from ops.engine_ctl import EngineCtl
from ops.hostprobe import model_facts
from ops.layout import Die, Layout
from ops.probe import drop_stale_socket

NO_ENV_FILE = Path("/nonexistent/.env")


def test_check_refuses_a_demo_model_the_generator_does_not_make() -> None:
    facts = model_facts("demo-huge", REPO_ROOT)
    assert not facts["ok"] and "demo-tiny" in facts["problem"] and "demo-small" in facts["problem"], facts
    assert model_facts("demo-tiny", REPO_ROOT)["ok"]


def test_a_regular_file_at_the_socket_path_is_never_removed(socket_path: str) -> None:
    path = Path(socket_path)
    path.write_text("precious")
    assert not drop_stale_socket(path)
    assert path.read_text() == "precious"


def test_a_socket_another_program_listens_on_is_never_removed(socket_path: str) -> None:
    path = Path(socket_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(path))
        other.listen()
        assert not drop_stale_socket(path)
        assert path.is_socket()


def test_a_socket_nothing_listens_on_is_removed(socket_path: str) -> None:
    path = Path(socket_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # what a killed rank 0 leaves behind
    assert path.is_socket()
    assert drop_stale_socket(path)
    assert not path.exists()
    assert drop_stale_socket(path)  # nothing there: nothing to do


def test_start_names_a_ring_port_in_use_instead_of_failing_later_without_it() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = load_settings({"HOSTS": "127.0.0.1,127.0.0.1", "RING_PORT": str(port - 1)}, NO_ENV_FILE)
        with pytest.raises(Die, match=f"port {port} is in use .* need ports {port - 1} to {port}"):
            EngineCtl(Layout(settings)).refuse_taken_ring_ports()
    EngineCtl(Layout(settings)).refuse_taken_ring_ports()  # free again: nothing to say
