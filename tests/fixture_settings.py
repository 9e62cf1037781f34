"""Runtime settings for tests, built from the shipped profiles (configs/rollout/cpu.yaml, configs/prompt/react.yaml):
their values have one home, the YAML; a test names only what it changes."""

from __future__ import annotations

import dataclasses
import functools

from eto_train.config import Config, shipped
from eto_train.prompting import PromptConfig
from eto_train.rollouts.loop import GenerationConfig, RolloutConfig


@functools.lru_cache(maxsize=None)
def default_config() -> Config:
    return shipped()


def env_common() -> dict:
    """configs/env_common.yaml: eto-train's own keys of every env section (workers, the guard's bounds, faults...)."""
    return default_config().env.model_dump(mode="json", include={"dev_holdout", "metric", "workers", "faults",
                                                                 "call_timeout_s", "max_observation_chars"})


def env_file(name: str) -> dict:
    """configs/env/<name>.yaml over configs/env_common.yaml, as configs/config.yaml composes them (no Hydra)."""
    from omegaconf import OmegaConf

    from eto_train.layout import CONFIGS

    return OmegaConf.to_container(OmegaConf.merge(OmegaConf.load(CONFIGS / "env_common.yaml"),
                                                  OmegaConf.load(CONFIGS / "env" / f"{name}.yaml")))


def rollout_config(**kw) -> RolloutConfig:
    """configs/rollout/cpu.yaml's engine settings (seed 0) with ``kw`` over them."""
    s = default_config().rollout
    return RolloutConfig(**{"batch_size": s.batch_size, "env_retries": s.env_retries, "seed": 0,
                            "overlap_env": s.overlap_env, **kw})


def generation(**kw) -> GenerationConfig:
    """configs/rollout/cpu.yaml's generation section (greedy, 20 new tokens) with ``kw`` over it."""
    return GenerationConfig.model_validate({**default_config().rollout.generation.model_dump(), **kw})


def react_prompt(**kw) -> PromptConfig:
    """configs/prompt/react.yaml's prompt (the CPU default) with ``kw`` over it."""
    return dataclasses.replace(default_config().prompt.prompt_config(), **kw)
