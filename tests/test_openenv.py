"""``env=openenv`` against an OpenEnv server the test starts on 127.0.0.1 (tests/openenv_server.py,
built with openenv-core's server SDK): bc -> eto-iter -> eval through the CLI, and a server killed
mid-episode ending as an environment failure (recovered or not scored), never a training example."""

from __future__ import annotations

import json
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

    def _start(self):
        proc = subprocess.Popen([sys.executable, str(SERVER), str(self.port), str(self.trigger)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return proc
            time.sleep(0.1)
        proc.kill()
        raise RuntimeError("the OpenEnv test server did not start")

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
    # the policy wins its training tasks greedily: exploration samples hot, so that it loses some (pairs)
    cli("eto-iter", trained, server.url, "eto.explore.rollout.generation.do_sample=true",
        "eto.explore.rollout.generation.temperature=5.0")
    cli("eval", trained, server.url)
    run = trained / "oe"
    experts = [json.loads(line) for line in (run / "experts" / "train.jsonl").read_text().splitlines()]
    assert len(experts) == 4 and all(e["status"] == "success" and e["env"] == "openenv" for e in experts)
    assert experts[0]["env_version"].startswith("openenv-core ")
    assert json.loads((run / "eto" / "iter1" / "dpo" / "manifest.json").read_text())["status"] == "done"
    m = OE.metrics(trained, "bc", "seen")
    assert m["overall"]["episodes"] == 2 and m["overall"]["environment_failures"] == 0


def test_a_server_killed_mid_episode_is_recovered_when_it_comes_back(server, trained):
    before = len(server.exits)
    m, episodes = OE.killed_eval(server, trained, "killed_back")
    assert server.exits[before:] == [17]  # it died once, mid-episode, and came back
    assert m["overall"]["episodes"] == 2 and m["overall"]["environment_failures"] == 0
    assert m["overall"]["environment_errors"] >= 1 and m["overall"]["recovered_episodes"] >= 1
    assert all(e["status"] != "environment_failure" for e in episodes)


def test_a_server_that_stays_dead_ends_its_episodes_as_environment_failures(server, trained):
    server.restart = False
    try:
        # one connection attempt per instance: a dead server is named at once (the default, 3 retries with
        # a back-off, only makes this test wait; the retries themselves are the rollout's)
        m, episodes = OE.killed_eval(server, trained, "killed_dead", "env.connect_retries=0", code=2)
    finally:
        server.restart = True  # back up for what follows
    failed = [e for e in episodes if e["status"] == "environment_failure"]
    assert failed and m["overall"]["environment_failures"] == len(failed)
    # every episode failed: nothing about the policy was measured, so the command says so, exit 2 (issue 37)
    assert len(failed) == len(episodes) and "NothingScored: [eval/killed_dead/seen] every one of its" in \
        OE.last.stderr
    assert any("EnvironmentFailure" in err for e in failed for err in e["env_errors"])
    assert all(e["status"] in ("environment_failure", "success", "max_steps", "failure") for e in episodes)
    from eto_train.records import NOT_POLICY_FAULT  # what BC, pairs and the scores leave out

    assert "environment_failure" in NOT_POLICY_FAULT
