"""Batched rollouts: many episodes step in lockstep, one batched generate call per step.

A pool of environment instances (one per slot) plays the task queue. Each step renders every
active conversation with the chat template, left-pads them into one batch and calls
``model.generate`` once (KV-cached within the call, greedy unless configured). When an episode
ends its slot takes the next task (continuous batching), so the batch stays full. With
``env.workers: N`` the instances live in N worker processes (:mod:`eto_train.envs.workers`,
slot i in worker i % N): a step's calls (and resets) are sent to them at once and their answers
read in row order; the episodes are those played in one process.

Written by hand: HF ``generate`` batches a single turn, and vLLM is a GPU engine; no
maintained library drives multi-turn text environments in lockstep on a CPU.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..config import Generation, RolloutSection
from ..envs.base import Environment, EnvironmentFailure, StepResult, Task
from ..envs.guard import env_seconds
from ..envs.workers import Ready, hosting, placed, sends_async
from ..interrupt import interrupted
from ..prompting import (PromptConfig, first_user_message, fit_prompt, format_action, parse_action,
                         render_observation, rollout_context, system_message)
from ..records import Episode, PolicyRef, Step, episode_key

if TYPE_CHECKING:
    from .progress import RolloutProgress


@dataclass(frozen=True)
class WorkItem:
    """One episode to play: a task, a sample index and an optional expert prefix.

    With a prefix (step-level contrast, paper App. B) the expert's first actions are replayed
    and recorded as the episode's first steps; the policy acts from there on. A step value's
    continuation (``eto.pairs.contrast=step_value``) names its ``parent`` and may replay an
    ``unparsed`` output after the prefix.
    """

    task: Task
    sample_index: int = 0
    prefix: tuple[str, ...] = ()
    # what the episode belongs to (step values, eto.pairs.contrast=step_value: the step, the branch
    # agent|expert, the rollout index); recorded as the episode's env_params["parent"]. When set, the
    # key also names the prefix's actions: prefixes of one length that differ in their last action
    # are different episodes (the App. B continuations, without one, keep their keys)
    parent: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # an output that did not parse, replayed after the prefix as one more step (the format checker's
    # answer, no environment call, as in play): the agent's malformed action valued by step values
    unparsed: str | None = None

    def key(self, policy_id: str, seed: int) -> str:
        tag = f"{self.sample_index}+p{len(self.prefix)}" if self.prefix else self.sample_index
        if self.parent:
            tag = f"{tag}+{self.parent.get('branch', '')}:{prefix_tag(self.prefix, self.unparsed)}"
        return episode_key(policy_id, self.task.task_id, tag, seed)


def prefix_tag(prefix: tuple[str, ...], unparsed: str | None = None) -> str:
    """A short hash of a prefix's actions and unparsed last output (a WorkItem key's part that
    tells prefixes of one length apart)."""
    text = "\x1f".join(prefix) + ("" if unparsed is None else "\x1e" + unparsed)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# How a policy decodes: the config's ``rollout.generation`` section itself (one home for its values and bounds).
GenerationConfig = Generation


class Policy:
    """A causal LM + tokenizer that answers a batch of conversations."""

    def __init__(self, model, tokenizer, gen: GenerationConfig, max_context: int | None = None):
        self.model, self.tok, self.gen = model, tokenizer, gen
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", 2048)
        self.stop_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
        self.model.eval()

    def _encode(self, conv: list[dict[str, str]]) -> tuple[list[int], int]:
        """Token ids of the prompt, fitted to the context (see :func:`eto_train.prompting.fit_prompt`);
        the count (turns dropped, +1 for a cut observation) becomes the episode's ``truncated_turns``."""
        ids, dropped, cut = fit_prompt(self.tok, conv, self.max_context - self.gen.max_new_tokens)
        return ids, dropped + (1 if cut else 0)

    def session(self):
        """A KV-cached batch whose rows persist across turns (see :mod:`eto_train.rollouts.kvbatch`), or
        None for a model with sliding-window attention layers (Gemma-2/3): their cache keeps only
        the window, which the engine's per-row cache surgery does not model, so those models
        answer whole conversations with HF ``generate`` each turn (slower, exact)."""
        from .kvbatch import KVBatch

        if uses_sliding_window(self.model.config):
            return None
        g = self.gen
        return KVBatch(self.model, self.tok, g.max_new_tokens, self.max_context, g.do_sample, g.temperature,
                       g.top_p, encode_full=self._encode, stop_ids=self.stop_ids)

    def generate(self, convs: list[list[dict[str, str]]]) -> list[tuple[str, int, int, int]]:
        """For each conversation: (text, prompt tokens, completion tokens, turns dropped)."""
        import torch

        enc = [self._encode(c) for c in convs]
        width = max(len(ids) for ids, _ in enc)
        pad = self.tok.pad_token_id
        input_ids = torch.full((len(enc), width), pad, dtype=torch.long)
        attn = torch.zeros((len(enc), width), dtype=torch.long)
        for i, (ids, _) in enumerate(enc):  # left padding: every row ends where generation starts
            input_ids[i, width - len(ids):] = torch.tensor(ids)
            attn[i, width - len(ids):] = 1
        kwargs = dict(max_new_tokens=self.gen.max_new_tokens, do_sample=self.gen.do_sample,
                      pad_token_id=pad, eos_token_id=self.stop_ids)
        if self.gen.do_sample:
            kwargs.update(temperature=self.gen.temperature, top_p=self.gen.top_p)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attn.to(device),
                                      **kwargs).cpu()
        results = []
        for i, (ids, dropped) in enumerate(enc):
            new = out[i, width:].tolist()
            n = first_stop(new, self.stop_ids)  # count up to and including the stop token
            text = self.tok.decode(new[:n], skip_special_tokens=True).strip()
            results.append((text, len(ids), n, dropped))
        return results


def stop_token_ids(tok, generation_config=None) -> list[int]:
    """Every token id that ends an assistant turn: the tokenizer's eos and the model's
    ``generation_config.eos_token_id`` (Llama-3.1 lists <|end_of_text|>, <|eom_id|> and
    <|eot_id|>; Gemma-3 <eos> and <end_of_turn>; Qwen <|im_end|> and <|endoftext|>)."""
    eos = getattr(generation_config, "eos_token_id", None)
    ids = [tok.eos_token_id] + (list(eos) if isinstance(eos, (list, tuple)) else [eos])
    return sorted({int(i) for i in ids if i is not None})


def first_stop(new: list[int], stop_ids) -> int:
    """The number of generated tokens up to and including the first stop token (all if none)."""
    return next((j + 1 for j, t in enumerate(new) if t in stop_ids), len(new))


def uses_sliding_window(config) -> bool:
    """Whether some attention layer of the model sees only a sliding window of the context."""
    types = getattr(config, "layer_types", None) or []
    if any("sliding" in str(t) for t in types):
        return True
    window = getattr(config, "sliding_window", None)
    return bool(window) and getattr(config, "use_sliding_window", True) is not False and not types


class _Stateless:
    """Session adapter for policies that only answer whole conversations (``generate``)."""

    def __init__(self, policy):
        self.policy = policy

    def add_row(self):
        pass

    def keep(self, rows):
        pass

    def step(self, convs):
        return self.policy.generate(convs)


@dataclass
class _Slot:
    env: Environment
    index: int = 0  # its place in the pool (with env.workers: the worker, index % N)
    item: WorkItem | None = None
    episode: Episode | None = None
    conv: list[dict[str, str]] = field(default_factory=list)
    valid_actions: list[str] | None = None
    reward: float = 0.0
    prompt: PromptConfig | None = None  # renders observations into user turns


@dataclass
class RolloutConfig:
    """The engine's settings: a ``rollout`` section's (:meth:`of`) and the root ``seed``. No values of its own:
    they live in configs/rollout/*.yaml."""

    batch_size: int
    env_retries: int  # a failed environment call is retried this many times
    seed: int  # the run's seed (the root `seed`)
    overlap_env: bool  # step an episode's environment while other rows decode

    @classmethod
    def of(cls, section: RolloutSection, seed: int) -> "RolloutConfig":
        return cls(batch_size=section.batch_size, env_retries=section.env_retries, seed=seed,
                   overlap_env=section.overlap_env)


class _RetriesExhausted(Exception):
    pass


def run_rollouts(
    work: Iterable[WorkItem | tuple[Task, int]],
    make_env: Callable[[], Environment],
    policy: Policy,
    policy_ref: PolicyRef,
    prompt: PromptConfig,
    cfg: RolloutConfig,
    on_episode: Callable[[Episode], None],
    on_step: Callable[[int], None] | None = None,
    progress: RolloutProgress | None = None,
) -> None:
    """Play every item of ``work``; hand each finished episode to ``on_episode``. ``progress``
    (:class:`eto_train.rollouts.progress.RolloutProgress`, whatever the policy's backend) counts each
    episode once ``on_episode`` has taken it, and each batched step's rows.

    With ``env.workers`` > 0 in the env config behind ``make_env``, the environments live in
    worker processes (:mod:`eto_train.envs.workers`, started here and stopped on the way out)."""
    import torch

    if progress is not None:
        on_episode = _counted(on_episode, progress)

    torch.manual_seed(cfg.seed)
    queue = [w if isinstance(w, WorkItem) else WorkItem(*w) for w in work]
    queue.reverse()  # pop() from the end keeps the given order
    with hosting() as host:
        _play(queue, make_env, policy, policy_ref, prompt, cfg, on_episode, on_step, progress, host)


def _play(queue, make_env, policy, policy_ref, prompt, cfg, on_episode, on_step, progress, host) -> None:
    slots: list[_Slot] = []
    worker: Any = _InLine()
    stopping = False  # an error or a Ctrl-C on its way out: stop the simulators without adding to it
    try:
        for i in range(min(cfg.batch_size, len(queue))):
            slots.append(_Slot(env=_new_env(make_env, i), index=i))
        # Environments in worker processes (env.workers): each row's call is sent to its worker, the
        # workers step at once, the answers are read in row order (_Sent). Else one worker thread
        # steps them (overlap_env): a row's action goes to its simulator as soon as the row has
        # finished decoding, while the other rows still decode (torch and the JVM then use both
        # cores). Either way the calls are made in one fixed order (the order in which rows finish,
        # itself deterministic, or row order), so fault draws and episodes stay reproducible.
        remote = bool(slots) and sends_async(slots[0].env)
        session = (policy.session() if hasattr(policy, "session") else None) or _Stateless(policy)
        if cfg.overlap_env and not remote:
            worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env")
        early = cfg.overlap_env and "on_row" in inspect.signature(session.step).parameters
        args = (policy_ref, prompt, cfg, make_env, on_episode)
        starts = [(i, s, _start_next(s, queue, *args, defer=remote)) for i, s in enumerate(slots)]
        active = [s for _, s in _settle(starts, queue, args)]
        for _ in active:
            session.add_row()
        while active:
            pending: dict[int, Any] = {}

            def submit(row: int, text: str, rows=active, pending=pending) -> None:
                action = parse_action(text)
                if action is not None:
                    slot = rows[row]
                    pending[row] = _send_step(slot, cfg, make_env, action) if remote else \
                        worker.submit(_env_step, slot, cfg, make_env, action)

            t0 = time.perf_counter()
            outs = session.step([s.conv for s in active], on_row=submit) if early else \
                session.step([s.conv for s in active])
            latency = time.perf_counter() - t0
            for row, (text, *_) in enumerate(outs):
                if row not in pending:
                    submit(row, text)
            kept, restarted = [], []
            for row, (slot, (text, n_prompt, n_new, dropped)) in enumerate(zip(active, outs)):
                result = _answer(pending[row]) if row in pending else None
                if _advance(slot, text, result, n_prompt, n_new, dropped, latency, prompt, on_episode):
                    kept.append((row, slot))  # same episode: its cache row continues
                else:
                    started = _start_next(slot, queue, *args, defer=remote)
                    if started:
                        restarted.append((row, slot, started))
            restarted = _settle(restarted, queue, args)
            session.keep([row for row, _ in kept])
            for _ in restarted:
                session.add_row()  # a new episode starts with an empty cache row
            active = [s for _, s in kept] + [s for _, s in restarted]
            if on_step:
                on_step(len(outs))
            if progress is not None:
                progress.steps_done(len(outs))
    except BaseException:
        stopping = True
        raise
    finally:
        # Episodes already handed to on_episode are recorded; the ones in play are dropped (a
        # rerun plays them again). Environment steps not started yet are cancelled; worker
        # processes stopping on an error close their environments themselves.
        worker.shutdown(wait=True, cancel_futures=stopping)
        if stopping:
            host.stop()
        _close_all([s.env for s in slots], quiet=stopping)


def _new_env(make_env: Callable[[], Environment], index: int) -> Environment:
    """A fresh environment for slot ``index`` (with env.workers: in worker ``index % N``)."""
    with placed(index):
        return make_env()


def _counted(on_episode: Callable[[Episode], None], progress: RolloutProgress) -> Callable[[Episode], None]:
    def record(ep: Episode) -> None:
        on_episode(ep)
        progress.episode_done()  # after the episode is recorded: a failed write is not "done"
    return record


def _close_all(envs: list[Environment], quiet: bool) -> None:
    """Close every environment, even when one fails to; with ``quiet`` (the rollout is being
    stopped) a failing close is ignored, otherwise the first failure is raised after the rest."""
    first = None
    for env in envs:
        try:
            env.close()
        except Exception as exc:
            first = first or exc
    if first is not None and not quiet:
        raise first


class _InLine:
    """The executor interface, calling in line (``rollout.overlap_env: false``)."""

    class _Done:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    def submit(self, fn, *args):
        return self._Done(fn(*args))

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _env_step(slot, cfg, make_env, action: str):
    """The environment's answer to ``action`` (with recovery), or the exhausted-retries error."""
    try:
        return _call(slot, cfg, make_env, lambda env: env.step(action))
    except _RetriesExhausted as exc:
        return exc


def _answer(pending):
    """A sent step's answer, or the exhausted-retries error."""
    try:
        return pending.result()
    except _RetriesExhausted as exc:
        return exc


class _Sent:
    """A call sent to a worker process (``send(env)`` returns its pending answer); ``result()``
    is the answer, recovered as :func:`_call` recovers an in-process call (``fn(env)`` on a fresh
    instance), or raises :class:`_RetriesExhausted`. A call that fails as it is sent (a fault
    injected in this process, a worker gone) is recovered at once, at its place among the
    rollout's calls, as in process."""

    def __init__(self, slot, cfg, make_env, send, fn) -> None:
        self.slot, self.cfg, self.make_env, self.fn = slot, cfg, make_env, fn
        try:
            self.pending = send(slot.env)
        except EnvironmentFailure as exc:
            self.pending = Ready(error=exc)
            self.result()  # raises _RetriesExhausted when every retry fails

    def result(self):
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.value = _call(self.slot, self.cfg, self.make_env, self.fn, first=pending.result)
        return self.value


def _send_step(slot, cfg, make_env, action: str):
    try:
        return _Sent(slot, cfg, make_env, lambda env: env.step_async(action), lambda env: env.step(action))
    except _RetriesExhausted as exc:
        return Ready(exc)


def _start_next(slot, queue, policy_ref, prompt, cfg, make_env, on_episode, defer: bool = False):
    """Reset the slot's env on the next task; False when the queue is empty. ``defer``
    (environments in worker processes): a reset may be left on its way, a :class:`_Starting`."""
    while queue:
        slot.item = queue.pop()
        started = _reset(slot, policy_ref, prompt, cfg, make_env, on_episode, defer)
        if started:
            return started
    return False


def _settle(starts, queue, args) -> list:
    """(key, slot) of each start of ``starts`` (key, slot, True or a _Starting) that plays, in
    order; a slot whose reset on its way failed takes the next task of the queue now."""
    out = []
    for key, slot, started in starts:
        while isinstance(started, _Starting):
            started = started.finish() or _start_next(slot, queue, *args)
        if started:
            out.append((key, slot))
    return out


class _Starting:
    """A slot's episode whose reset was sent to a worker process; ``finish()`` as :func:`_reset`."""

    def __init__(self, slot, sent: _Sent, on_episode) -> None:
        self.slot, self.sent, self.on_episode = slot, sent, on_episode

    def finish(self) -> bool:
        try:
            first = self.sent.result()
        except _RetriesExhausted as exc:
            first = exc
        return _begin(self.slot, self.slot.item, first, self.on_episode)


def _reset(slot, policy_ref, prompt, cfg, make_env, on_episode, defer: bool = False):
    """Start the slot's episode on ``slot.item``: True when it plays, False when it ended as an
    environment failure. ``defer`` and no expert prefix: the reset is sent and a
    :class:`_Starting` returned, which says so once the answer is in."""
    task, item = slot.item.task, slot.item
    ep = Episode(
        episode_id=item.key(policy_ref.id, cfg.seed),
        task_id=task.task_id, env=task.env, game=task.game, fold=task.fold, seed=task.seed,
        split=task.split, env_version=slot.env.version, policy=policy_ref,
        prompt_version=prompt.version, system="", opening=prompt.opening, first_user="",
        instruction="", first_observation="", sample_index=item.sample_index,
        env_params={"parent": dict(item.parent)} if item.parent else {})  # kept by a reset that fails
    slot.episode, slot.conv, slot.prompt = ep, [], prompt
    try:
        if defer and not item.prefix and item.unparsed is None:
            return _Starting(slot, _Sent(slot, cfg, make_env, lambda env: env.reset_async(task),
                                         lambda env: env.reset(task)), on_episode)
        first = _call(slot, cfg, make_env, lambda env: env.reset(task))
    except _RetriesExhausted as exc:
        first = exc
    if not _begin(slot, item, first, on_episode):
        return False
    try:
        for action in item.prefix:  # the expert's steps, replayed
            res = _call(slot, cfg, make_env, lambda env: env.step(action))
            _record(slot, format_action(action), action, action in (slot.valid_actions or [action]), res, 0.0, 0, 0, 0)
        if item.unparsed is not None:
            res = StepResult(observation=prompt.invalid_format, reward=slot.reward, done=False, success=False)
            _record(slot, item.unparsed, None, False, res, 0.0, 0, 0, 0)
    except _RetriesExhausted as exc:
        return _env_failed(slot, exc, on_episode)
    if ep.steps and (ep.steps[-1].done or len(ep.steps) >= slot.env.max_steps(task)):
        raise ValueError(f"{task.task_id}: expert prefix of {len(item.prefix)} steps already ends the episode")
    return True


def _begin(slot, item, first, on_episode) -> bool:
    """The episode's opening from the reset's answer ``first`` (instruction, first observation),
    or its end as an environment failure when ``first`` is the exhausted-retries error."""
    ep, task, prompt = slot.episode, item.task, slot.prompt
    try:  # what the game tells the agent (asked after the reset: a worker answers both in one go)
        ep.system = system_message(prompt, slot.env.action_forms(task.game))["content"]
        ep.env_params = {"max_steps": slot.env.max_steps(task), "expert_prefix": len(item.prefix),
                         **({"parent": dict(item.parent)} if item.parent else {})}
    except EnvironmentFailure:  # only a worker that died under a failed reset cannot say
        if not isinstance(first, _RetriesExhausted):
            raise
    if isinstance(first, _RetriesExhausted):
        return _env_failed(slot, first, on_episode)
    instruction, first = first
    user = first_user_message(prompt, instruction, first.observation)
    ep.instruction, ep.first_observation, ep.first_user = instruction, first.observation, user["content"]
    slot.conv = rollout_context(prompt, ep.system, user["content"])
    slot.valid_actions, slot.reward = first.valid_actions, first.reward
    return True


def _record(slot, text, action, valid, res, latency, n_prompt, n_new, dropped) -> None:
    ep = slot.episode
    slot.valid_actions = res.valid_actions if action is not None else slot.valid_actions
    slot.reward = res.reward
    ep.truncated_turns = max(ep.truncated_turns, dropped)
    # the record keeps the observation turn as the model saw it (prompt.observation_template);
    # an unparsed output's answer is the format checker's message, as written
    obs = render_observation(slot.prompt, res.observation) if action is not None else res.observation
    ep.steps.append(Step(index=len(ep.steps), raw_output=text, action=action, valid=valid,
                         observation=obs, reward=res.reward, done=res.done,
                         latency_s=round(latency, 4), prompt_tokens=n_prompt, completion_tokens=n_new,
                         env_s=env_seconds(res) if action is not None else 0.0))
    slot.conv += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]


def _call(slot, cfg, make_env, fn, first=None):
    """``fn(env)`` on the slot's environment, recovering from environment failures (the first
    attempt's answer is ``first()`` when given: a call already sent).

    Each failure is logged in the episode (``env_errors``); the instance is replaced by a fresh
    one, the episode so far is rebuilt on it (reset and the recorded actions replayed, each
    answer checked against the recorded observation), and ``fn`` is tried again, after an
    exponential backoff, up to ``cfg.env_retries`` times. Rebuilding by replay, rather than
    playing the episode again from scratch, keeps what the policy already did: the episode
    continues exactly where it failed (same actions, same KV-cache row), so a recovered episode
    is the episode a fault-free run records. Written by hand: no maintained library checkpoints
    a text simulator's state; replay of the recorded actions is the portable way to restore it.
    """
    ep = slot.episode
    for attempt in range(cfg.env_retries + 1):
        try:
            if attempt:
                time.sleep(min(0.05 * 2 ** attempt, 2.0))  # backoff before trying the call again
                _rebuild(slot)
            elif first is not None:  # the call was sent already (to a worker process): its answer
                return first()
            return fn(slot.env)
        except EnvironmentFailure as exc:
            if interrupted():  # a call cut short by Ctrl-C: stop, do not start another simulator
                raise KeyboardInterrupt from None
            ep.env_errors.append(f"{type(exc).__name__}: {exc}")
            try:
                slot.env.close()
            except Exception:  # a crashed instance may not close cleanly; it is discarded anyway
                pass
            slot.env = _new_env(make_env, slot.index)
    raise _RetriesExhausted(f"{ep.env_errors[-1]} (after {cfg.env_retries} retries)")


def _rebuild(slot) -> None:
    """Bring a fresh instance to where the episode stands: reset, then replay the recorded actions."""
    ep, env = slot.episode, slot.env
    if not slot.conv:  # the reset itself failed: nothing to replay
        return
    instruction, first = env.reset(slot.item.task)
    if (instruction, first.observation) != (ep.instruction, ep.first_observation):
        raise EnvironmentFailure(f"replay of {ep.task_id}: the reset answered differently than recorded")
    for st in ep.steps:
        if st.action is None:  # an unparsed output never reached the environment
            continue
        res = env.step(st.action)
        if render_observation(slot.prompt, res.observation) != st.observation:
            raise EnvironmentFailure(f"replay of {ep.task_id}: step {st.index} answered differently than recorded")


def _env_failed(slot, exc, on_episode) -> bool:
    """Record the episode as an environment failure (never a negative in training)."""
    slot.episode.finish("environment_failure", error=str(exc))
    on_episode(slot.episode)
    return False


def _advance(slot, text, result, n_prompt, n_new, dropped, latency, prompt, on_episode) -> bool:
    """Apply one model output and the environment's ``result`` (None when the output did not
    parse) to the slot's episode; False when the episode has ended."""
    ep, task = slot.episode, slot.item.task
    action = parse_action(text)
    if action is None:
        res = StepResult(observation=prompt.invalid_format, reward=slot.reward, done=False, success=False)
        valid = False
    else:
        if isinstance(result, _RetriesExhausted):
            return _env_failed(slot, result, on_episode)
        res = result
        # games that do not list valid actions (ScienceWorld's fast path) say whether they parsed it
        valid = action in slot.valid_actions if slot.valid_actions is not None else bool(res.info.get("recognized", True))
    _record(slot, text, action, valid, res, latency, n_prompt, n_new, dropped)
    if res.done or len(ep.steps) >= slot.env.max_steps(task):
        ep.finish("success" if res.success else "failure" if res.done else "max_steps")
        on_episode(ep)
        return False
    return True
