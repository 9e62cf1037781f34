from __future__ import annotations

from eto_train.envs import EnvironmentFailure, StepResult, Task, make_env
from eto_train.model.load import load_model, load_tokenizer, policy_ref
from eto_train.rollouts.loop import Policy, run_rollouts
from fixture_settings import react_prompt, rollout_config, generation


class ScriptedPolicy:
    """Answers every conversation with a fixed action; stands in for a model."""

    def __init__(self, text):
        self.text, self.calls = text, []

    def generate(self, convs):
        self.calls.append(len(convs))
        return [(self.text, 10, 3, 0) for _ in convs]


class FlakyEnv:
    """A two-step game: 'go' wins at step 2. Seeds listed in ``crash`` crash on every reset."""

    name = "flaky"
    version = "flaky-1"

    def __init__(self, crash=(), crash_once=None):
        self.crash, self.crash_once, self.t = set(crash), crash_once, 0

    def tasks(self, split):
        return [Task("flaky", "g", "train", s, split) for s in range(5)]

    def max_steps(self, task):
        return 4

    def action_forms(self, game):
        return ["go"]

    def reset(self, task):
        if task.seed in self.crash or (self.crash_once is not None and self.crash_once.pop(task.seed, False)):
            raise EnvironmentFailure(f"simulator died on seed {task.seed}")
        self.t = 0
        return "Reach the goal.", StepResult("start", 0.0, False, False, valid_actions=["go"])

    def step(self, action):
        self.t += 1
        won = action == "go" and self.t == 2
        return StepResult("moved", 1.0 if won else 0.5, won, won, valid_actions=["go"])

    def expert_actions(self, task):
        return ["go", "go"]

    def close(self):
        pass


def _run(work, make, policy, batch=2, retries=1):
    eps = []
    run_rollouts(work, make, policy, _ref(), _prompt(),
                 rollout_config(batch_size=batch, env_retries=retries), on_episode=eps.append)
    return eps


def _ref():
    from eto_train.records import PolicyRef
    return PolicyRef(id="scripted@0")


def _prompt():
    return react_prompt()


def test_every_task_gets_one_episode_and_batches_stay_full():
    pol = ScriptedPolicy("Action: go")
    work = [(t, 0) for t in FlakyEnv().tasks("train")]
    eps = _run(work, FlakyEnv, pol, batch=2)
    assert sorted(e.seed for e in eps) == [0, 1, 2, 3, 4]
    assert all(e.status == "success" and e.num_steps == 2 for e in eps)
    assert pol.calls == [2, 2, 2, 2, 1, 1]  # continuous batching: freed slots take new tasks
    assert len({e.episode_id for e in eps}) == 5


def test_unparseable_output_is_an_invalid_step_and_the_episode_hits_the_step_limit():
    eps = _run([(Task("flaky", "g", "train", 0, "train"), 0)], FlakyEnv, ScriptedPolicy("go go go"))
    (ep,) = eps
    assert ep.status == "max_steps" and ep.num_steps == 4
    assert all(s.action is None and not s.valid for s in ep.steps)
    assert ep.steps[0].observation.startswith("Invalid format")


def test_environment_crash_is_retried_then_recorded_as_environment_failure():
    crash_once = {1: True}
    work = [(t, 0) for t in FlakyEnv().tasks("train")]
    eps = _run(work, lambda: FlakyEnv(crash={3}, crash_once=crash_once), ScriptedPolicy("Action: go"), retries=2)
    by_seed = {e.seed: e for e in eps}
    assert len(eps) == 5
    assert by_seed[1].status == "success"  # crashed once, retried under the same episode id
    assert by_seed[3].status == "environment_failure" and "simulator died" in by_seed[3].error
    assert by_seed[3].steps == []


def test_batched_generation_equals_one_at_a_time(tiny_model_dir, twx_cfg, prompt):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    ref = policy_ref(str(tiny_model_dir), name="tiny")
    gen = generation(max_new_tokens=8)
    lister = make_env(twx_cfg)
    work = [(t, 0) for t in lister.tasks("seen")]
    lister.close()

    def play(batch, overlap=True):
        eps = []
        run_rollouts(work, lambda: make_env(twx_cfg), Policy(model, tok, gen), ref, prompt,
                     rollout_config(batch_size=batch, overlap_env=overlap), on_episode=eps.append)
        return {e.task_id: [(s.raw_output, s.observation) for s in e.steps] for e in eps}

    batched, single, in_line = play(6), play(1), play(6, overlap=False)
    assert set(batched) == {t.task_id for t, _ in work}
    assert batched == single == in_line  # environments stepped in the worker thread or in line
