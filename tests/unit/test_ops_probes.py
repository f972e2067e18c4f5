"""What ops asks of the host before it acts: is the model one this host can serve, are the ring's ports
free, can the API listen where it is told to, and is a socket at SOCKET_PATH a stale one it may remove
(never another program's file or live socket)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from config import REPO_ROOT, load_settings
from ops.api_ctl import ApiCtl
from ops.engine_ctl import EngineCtl
from ops.hostprobe import model_facts
from ops.layout import Die, Layout
from ops.probe import drop_stale_socket
from ops.procs import free_ring_port
from ops.procs import free_port

NO_ENV_FILE = Path("/nonexistent/.env")


def test_check_refuses_a_demo_model_the_generator_does_not_make() -> None:
    facts = model_facts("demo-huge", REPO_ROOT)
    assert not facts["ok"] and "demo-tiny" in facts["problem"] and "demo-small" in facts["problem"], facts
    assert model_facts("demo-tiny", REPO_ROOT)["ok"]


def test_check_knows_the_zoo_and_refuses_a_name_it_does_not_make() -> None:
    facts = model_facts("zoo-qwen3_5", REPO_ROOT)
    assert not facts["ok"] and "is not a zoo model" in facts["problem"], facts
    assert "zoo-qwen3.5" in facts["problem"] and "zoo-gpt-oss-4bit" in facts["problem"], facts
    hybrid, sliding = model_facts("zoo-qwen3.5", REPO_ROOT), model_facts("zoo-gpt-oss-4bit", REPO_ROOT)
    assert hybrid["ok"] and sliding["ok"] and re.match(r"zoo-qwen3\.5 generator v\d+ [0-9a-f]{8}$", hybrid["identity"])
    assert hybrid["identity"] != sliding["identity"]


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
        # the taken port first: the port after it may be anyone's on a busy machine, the one before it too
        settings = load_settings({"HOSTS": "127.0.0.1,127.0.0.1", "RING_PORT": str(port)}, NO_ENV_FILE)
        with pytest.raises(Die, match=f"port {port} is in use .* need ports {port} to {port + 1}"):
            EngineCtl(Layout(settings)).refuse_taken_ring_ports()
    free = free_ring_port(2)
    free_range = load_settings({"HOSTS": "127.0.0.1,127.0.0.1", "RING_PORT": str(free)}, NO_ENV_FILE)
    EngineCtl(Layout(free_range)).refuse_taken_ring_ports()  # nothing to say


def test_start_names_the_doorbell_port_in_use() -> None:
    free = free_ring_port(2)
    settings = load_settings({"HOSTS": "127.0.0.1,127.0.0.1", "RING_PORT": str(free)}, NO_ENV_FILE)
    with socket.create_server(("", free - 1)):
        with pytest.raises(Die, match=f"port {free - 1} is in use .* rank 0's doorbell listens on it \\(RING_PORT-1\\)"):
            EngineCtl(Layout(settings)).refuse_taken_ring_ports()


def api_at(host: str, port: int, run_dir: str) -> ApiCtl:
    return ApiCtl(Layout(load_settings({"API_HOST": host, "API_PORT": str(port), "RUN_DIR": run_dir}, NO_ENV_FILE)))


def test_start_says_an_api_host_of_another_machine_is_one_instead_of_calling_its_port_taken(socket_path: str) -> None:
    with pytest.raises(Die, match="API_HOST='192.0.2.1' is not an address of this host"):
        api_at("192.0.2.1", free_port(), str(Path(socket_path).parent)).refuse_running()  # TEST-NET-1


def test_start_refuses_a_port_something_listens_on(socket_path: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(Die, match=f"something already listens on http://127.0.0.1:{port}"):
            api_at("127.0.0.1", port, str(Path(socket_path).parent)).refuse_running()
    api_at("127.0.0.1", port, str(Path(socket_path).parent)).refuse_running()  # free again: nothing to say


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux's setting")
def test_ports_tests_pick_lie_below_the_kernels_range_for_outgoing_connections() -> None:
    # an outgoing connection's source port could take a ring port between our check and the rank's bind
    first_outgoing = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for ranks in (1, 2, 4):
        base = free_ring_port(ranks)
        assert base - 1 >= 1024 and base + 2 * ranks < first_outgoing, (base, first_outgoing)
    assert all(free_port() < first_outgoing for _ in range(20))
