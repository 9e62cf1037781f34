"""``env=agentgym`` against an AgentGym-protocol server the test starts on 127.0.0.1
(tests/agentgym_server.py): each environment's protocol, bc -> eto-iter -> eval through the CLI with
AgentTraj experts, a server killed mid-episode ending as an environment failure (recovered or not
scored, never a training example), and a rollout batch of 64 over a few connections to a slow server
that drops connections, losing no episode and doubling none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eto_train.envs import EnvironmentFailure, EnvironmentTimeout
from eto_train.envs.agentgym import AgentGymEnv
from served_env import ServedRun
from test_openenv import Server
from fixture_settings import react_prompt, rollout_config

SERVER = Path(__file__).resolve().parent / "agentgym_server.py"


class AgentGymServer(Server):
    """tests/agentgym_server.py speaking ``protocol``, restarted whenever it exits (test_openenv's Server)."""

    def __init__(self, folder: Path, protocol: str = "sciworld", *flags: str) -> None:
        self.protocol, self.flags = protocol, flags
        super().__init__(folder)

    name = "AgentGym"

    def command(self) -> list[str]:
        return [sys.executable, str(SERVER), str(self.port), self.protocol, str(self.trigger), *self.flags]


def gold(idx: int) -> list[str]:
    return ["go", "wait", "go"] if idx % 2 else ["go", "go", "go"]


def agenttraj(path: Path, env_name: str, indices) -> Path:
    """AgentGym's expert trajectories (AgentTraj) of the goal game: the experts of the CLI test."""
    rows = []
    for i in indices:
        conv = [{"from": "human", "loss": None, "value": "You play a goal game. Answer 'Action: go' or 'Action: wait'."},
                {"from": "gpt", "loss": False, "value": "Ok."},
                {"from": "human", "loss": None, "value": f"Reach goal {i}.\nstart"}]
        for t, a in enumerate(gold(i), 1):
            conv.append({"from": "gpt", "loss": True, "value": f"Action: {a}"})  # short: 6 new tokens (TOY)
            if t < 3:
                conv.append({"from": "human", "loss": None, "value": f"step {t}"})
        rows.append({"item_id": f"{env_name}_{i}", "conversations": conv, "reward": 1.0})
    path.write_text(json.dumps(rows))
    return path


def play(env: AgentGymEnv, idx: int, actions) -> tuple[str, list]:
    from eto_train.envs.agentgym import AgentGymTask

    instruction, first = env.reset(AgentGymTask("agentgym", env.env_name, "train", idx, "train"))
    return instruction, [first, *(env.step(a) for a in actions)]


@pytest.mark.parametrize("protocol", ["webshop", "alfworld", "sciworld"])
def test_each_agentgym_protocol_plays_the_game(protocol, tmp_path):
    server = AgentGymServer(tmp_path, protocol)
    try:
        env = AgentGymEnv(url=server.url, env_name=protocol, splits={"train": {"start": 3, "count": 2}})
        assert [t.task_id for t in env.tasks("train")] == [f"{protocol}_3", f"{protocol}_4"]  # AgentTraj's ids
        instruction, results = play(env, 3, ["go", "wait", "go"])
        assert "goal 3" in instruction.lower()
        assert results[-1].done and results[-1].success and results[-1].reward == 1.0
        assert not results[1].done and results[0].reward == 0.0
        if protocol == "alfworld":
            assert results[0].valid_actions == ["go", "wait"]
        _, again = play(env, 4, ["go", "wait"])  # the same server instance, another task
        assert not again[-1].done and again[-1].reward == (0.0 if protocol == "alfworld" else pytest.approx(1 / 3, abs=0.01))
        env.close()
        with pytest.raises(NotImplementedError, match="experts.source"):
            env.expert_actions(env.tasks("train")[0])
    finally:
        server.stop()
    dead = AgentGymEnv(url=server.url, env_name=protocol, splits={}, retries=1, connect_timeout_s=1)
    with pytest.raises(EnvironmentFailure, match="cannot|failed|Connect"):
        play(dead, 0, [])


def test_a_slow_server_is_a_timeout(tmp_path):
    server = AgentGymServer(tmp_path, "sciworld", "--delay", "1.0")
    try:
        env = AgentGymEnv(url=server.url, env_name="sciworld", timeout_s=0.2)
        with pytest.raises(EnvironmentTimeout):
            play(env, 0, [])
    finally:
        server.stop()


# -- bc -> eto-iter -> eval through the CLI -------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = AgentGymServer(tmp_path_factory.mktemp("agentgym"), "sciworld")
    yield s
    s.stop()


AG = ServedRun("ag", "env=agentgym", "env.env_name=sciworld")
cli = AG.cli


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """experts (AgentTraj) -> model -> bc against the server (one BC for every test here)."""
    runs = tmp_path_factory.mktemp("runs")
    source = agenttraj(runs / "agenttraj.json", "sciworld", range(4))
    for stage in ("experts", "model", "bc"):
        cli(stage, runs, server.url, f"experts.source={source}")
    return runs


def test_bc_eto_iter_eval_against_an_agentgym_server(server, trained):
    experts = AG.eto_iter_and_eval(server, trained)
    assert sorted(e["task_id"] for e in experts) == [f"sciworld_{i}" for i in range(4)]  # AgentTraj ids bound


def test_a_server_killed_mid_episode_is_recovered_when_it_comes_back(server, trained):
    AG.recovered_eval(server, trained)


def test_a_server_that_stays_dead_ends_its_episodes_as_environment_failures(server, trained):
    AG.dead_eval(server, trained, "env.retries=0")


# -- load: 64 episodes, 4 connections, a slow server that drops connections ------------------------
def test_a_batch_of_64_over_4_connections_loses_no_episode(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from eto_train.records import PolicyRef
    from eto_train.rollouts.loop import run_rollouts
    from test_env_workers import HashPolicy

    server = AgentGymServer(tmp_path, "webshop", "--delay", "0.005", "--drop-every", "17")
    try:
        cfg = {"url": server.url, "env_name": "webshop", "splits": {"train": {"start": 0, "count": 64}},
               "step_limit": 5, "max_connections": 4, "timeout_s": 30}
        make = lambda: AgentGymEnv(**cfg)  # noqa: E731
        tasks = make().tasks("train")
        episodes = []
        run_rollouts([(t, 0) for t in tasks], make, HashPolicy(), PolicyRef(id="p@0"), react_prompt(),
                     rollout_config(batch_size=64, env_retries=5), on_episode=episodes.append)
        ids = sorted(e.task_id for e in episodes)
        assert ids == sorted(t.task_id for t in tasks)  # every episode, none twice
        assert all(e.status != "environment_failure" for e in episodes)
        assert sum(len(e.env_errors) for e in episodes) >= 1  # connections were dropped, and recovered

        def episode(task):  # 64 episodes at once on 4 connections (threads: the pool is shared)
            env = make()
            try:
                for attempt in range(6):
                    try:
                        _, results = play(env, task.seed, gold(task.seed))
                        return task.task_id, results[-1].success
                    except EnvironmentFailure:
                        env.close()
                        env = make()
                raise AssertionError(f"{task.task_id}: lost")
            finally:
                env.close()

        with ThreadPoolExecutor(64) as pool:
            done = list(pool.map(episode, tasks))
        assert sorted(i for i, _ in done) == sorted(t.task_id for t in tasks) and all(ok for _, ok in done)
    finally:
        server.stop()
