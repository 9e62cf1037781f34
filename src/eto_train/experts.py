"""Expert trajectories: the environment's gold action sequences played through the adapter.

Each expert episode is an ordinary :class:`Episode` (policy id ``expert``) so that behavior
cloning, pair building and evaluation read one format.
"""

from __future__ import annotations

from . import layout
from .envs.base import Environment, Task
from .prompting import PromptConfig, first_user_message, format_action, render_observation, system_message
from .records import NOT_POLICY_FAULT, Episode, PolicyRef, Step, episode_key

EXPERT = PolicyRef(id="expert")
IMPORTED = "imported"  # env_version prefix of experts read from a file (experts.source)


def usable(ep: Episode) -> bool:
    """An expert trajectory that BC clones and pairs contrast with: a gold path that won, or any
    imported one (the authors keep every trajectory of their files, WebShop's with rewards < 1,
    each with its own reward)."""
    if ep.status in NOT_POLICY_FAULT or not ep.steps:
        return False
    return ep.success or ep.env_version.startswith(IMPORTED)


def expert_episode(env: Environment, task: Task, prompt: PromptConfig,
                   prefix: int | None = None) -> Episode:
    """Replay the gold path of ``task`` (its first ``prefix`` actions only, if given)."""
    actions = env.expert_actions(task)
    if prefix is not None:
        actions = actions[:prefix]
    instruction, first = env.reset(task)
    sys_msg = system_message(prompt, env.action_forms(task.game))
    ep = Episode(
        episode_id=episode_key(EXPERT.id, task.task_id, 0, task.seed), task_id=task.task_id,
        env=task.env, game=task.game, fold=task.fold, seed=task.seed, split=task.split,
        env_version=env.version, policy=EXPERT, prompt_version=prompt.version,
        system=sys_msg["content"], opening=prompt.opening, first_user=first_user_message(prompt, instruction, first.observation)["content"],
        instruction=instruction, first_observation=first.observation,
        env_params={"max_steps": env.max_steps(task)})
    valid_actions, res = first.valid_actions, first
    for action in actions:
        valid = valid_actions is None or action in valid_actions
        res = env.step(action)
        valid_actions = res.valid_actions
        ep.steps.append(Step(index=len(ep.steps), raw_output=format_action(action), action=action,
                             valid=valid, observation=render_observation(prompt, res.observation), reward=res.reward,
                             done=res.done))  # no wall-clock time: an experts file is the same on every run
        if res.done:
            break
    ep.finish("success" if res.success else "failure" if res.done else "max_steps")
    return ep


class ExpertsEnvError(ValueError):
    """An experts file of another environment than the run's."""


def read_experts(path, env: str | None = None) -> list[Episode]:
    """The expert episodes of ``path`` (``paths.experts``), with an error that names the file
    and the stage that writes it when there is no file or no episode in it.

    ``env`` (the run's ``env.name``): every episode must be of that environment; an experts file
    of another one (a copied ``experts/train.jsonl``, ``paths.experts`` of another run) is refused
    with the file, both environments and the first such line, before anything trains on it.
    """
    from pathlib import Path

    from .store import read_episodes

    path = Path(path)
    writer = "the experts stage writes it: run `make experts` (`eto-train experts`) with this run's overrides"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no experts file; {writer}")
    episodes = read_episodes(path)
    if not episodes:
        raise ValueError(
            f"{path}: empty experts file (0 episodes); {writer} (if it says up to date, delete "
            f"{layout.manifest(path.parent)} first). If it writes none either, the training split is empty "
            f"(env.splits.train, env.tasks) or experts.source matches no training task")
    if env is not None:
        for i, ep in enumerate(episodes, start=1):
            if ep.env != env:
                found = sorted({e.env for e in episodes})
                raise ExpertsEnvError(
                    f"{path}: an experts file of environment {', '.join(map(repr, found))} (episode {i}, task "
                    f"{ep.task_id!r}), but this run's environment is env.name={env!r}: rebuild it for this "
                    f"environment (`eto-train experts` with this run's overrides; experts.source= a file of "
                    f"{env!r} or gold) or point paths.experts at this environment's file")
    return episodes


def usable_experts(path, env: str | None = None) -> dict[str, Episode]:
    """The :func:`usable` expert episodes of ``path`` (:func:`read_experts`), by task id: what ETO's
    exploration plays from and its pairs compare with (read once per iteration)."""
    return {e.task_id: e for e in read_experts(path, env) if usable(e)}
