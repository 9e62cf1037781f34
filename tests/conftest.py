"""Shared fixtures: real TextWorldExpress games and a tiny model built from their gold paths."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

TWX_SMALL = {
    "name": "twx",
    "step_limit": 12,
    "games": [{"name": "sorting", "params": ""}, {"name": "arithmetic", "params": ""}],
    "splits": {"train": {"fold": "train", "start": 0, "count": 6},
               "seen": {"fold": "train", "start": 900, "count": 3},
               "unseen": {"fold": "dev", "start": 0, "count": 2}},
}


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _cpp_kernels():
    """The project's C++ kernels run in the tests on every CPU, also where torch's are the faster and the default
    (native.faster): their answers are what is tested; the per-CPU choice is tests/test_native.py's."""
    from eto_train import native

    native.force(True)


@pytest.fixture(scope="session")
def twx_cfg():
    return {**TWX_SMALL, "splits": dict(TWX_SMALL["splits"])}


@pytest.fixture(scope="session")
def prompt():
    from fixture_settings import react_prompt

    return react_prompt()


@pytest.fixture(scope="session")
def expert_episodes(twx_cfg, prompt):
    from eto_train.envs import make_env
    from eto_train.experts import expert_episode

    env = make_env(twx_cfg)
    try:
        return [expert_episode(env, t, prompt) for t in env.tasks("train")]
    finally:
        env.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, expert_episodes):
    from eto_train.records import to_messages
    from fixture_models import tiny_model

    texts = [m["content"] for ep in expert_episodes for m in to_messages(ep)]
    return tiny_model(texts, tmp_path_factory.mktemp("tiny"), vocab_size=400, num_layers=2,
                      max_position_embeddings=1024)
