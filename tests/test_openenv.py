"""``env=openenv`` against an OpenEnv server the test starts on 127.0.0.1 (tests/openenv_server.py,
built with openenv-core's server SDK): bc -> eto-iter -> eval through the CLI, and a server killed
mid-episode ending as an environment failure (recovered or not scored), never a training example."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from served_env import ServedRun

SERVER = Path(__file__).resolve().parent / "openenv_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """tests/openenv_server.py in a process of its own, started again whenever it exits (unless
    ``restart`` is False); ``kill_at("800:1")``: it dies when the first step of seed 800 arrives."""

    def __init__(self, folder: Path) -> None:
        self.port, self.trigger, self.exits = free_port(), folder / "die_at", []
        self.restart, self._stop = True, False
        self.proc = self._start()
        threading.Thread(target=self._watch, daemon=True).start()

    name = "OpenEnv"

    def command(self) -> list[str]:
        return [sys.executable, str(SERVER), str(self.port), str(self.trigger)]

    def _start(self):
        """The server, once its port answers."""
        proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return proc
            time.sleep(0.05)
        proc.kill()
        raise RuntimeError(f"the {self.name} test server did not start")

    def _watch(self) -> None:
        while not self._stop:
            if self.proc.poll() is not None and self.restart and not self._stop:
                self.exits.append(self.proc.returncode)
                self.proc = self._start()
            time.sleep(0.05)

    def kill_at(self, when: str) -> None:
        self.trigger.write_text(when)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop = True
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("openenv"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """experts -> model -> bc against the server (one BC for every test here)."""
    runs = tmp_path_factory.mktemp("runs")
    for stage in ("experts", "model", "bc"):
        cli(stage, runs, server.url)
    return runs


OE = ServedRun("oe", "env=openenv")
cli = OE.cli


def test_bc_eto_iter_eval_against_an_openenv_server(server, trained):
    experts = OE.eto_iter_and_eval(server, trained)
    assert len(experts) == 4 and all(e["status"] == "success" and e["env"] == "openenv" for e in experts)
    assert experts[0]["env_version"].startswith("openenv-core ")


def test_a_server_killed_mid_episode_is_recovered_when_it_comes_back(server, trained):
    episodes = OE.recovered_eval(server, trained)
    assert all(e["status"] != "environment_failure" for e in episodes)


def test_a_server_that_stays_dead_ends_its_episodes_as_environment_failures(server, trained):
    # (the default, 3 retries with a back-off, only makes this test wait; the retries themselves are the rollout's)
    episodes = OE.dead_eval(server, trained, "env.connect_retries=0")
    assert all(e["status"] in ("environment_failure", "success", "max_steps", "failure") for e in episodes)
