"""Reading probes at the language-model level, on held-out transcripts.

Does the model read what an observation said? Two probes, each a point in a held-out
transcript where the text already fixed the answer:

- ``room`` (mapreader, or any game with rooms): after ``Action: move <dir>``, the next
  observation starts ``You are in the <room>.``; an earlier observation of the room the agent
  left said ``To the <Dir> you see the <room>.``. The probe asks whether the model's most likely
  room name there is that room. Candidates: every room name of the probe set (``accuracy``),
  and only those the transcript mentioned so far (``accuracy_mentioned``). Chance lines: always
  the most frequent answer (``chance_majority``), and uniform over the mentioned rooms
  (``chance_uniform_mentioned``).
- ``object`` (twc): at ``Action: take <object>``, does the model's most likely object name
  name an object that lies in the current room (one the game lets the agent take there and that
  the room's observation names)? Three readings: the model's own greedy continuation of
  ``Action: take`` (``in_room_greedy``: what the policy would do; the BC policy named objects
  that were not in the room); the most likely name by log-probability over every object name of
  the probe set (``in_room``; chance ``chance_uniform``: the in-room share of those names), and
  over the names the transcript mentioned so far (``in_room_mentioned``; chance
  ``chance_uniform_mentioned``: the share of mentioned objects that lie in the room). Also
  ``chance_majority``: always the most frequent in-room name.

Scoring is cheap: one forward over the context (its KV cache kept), then one batched forward
over the candidates' few tokens (in chunks) on copies of that cache. Any object with
``logprobs(context, continuations)`` and ``greedy(context)`` can be the scorer (the tests use
stubs that always name the right or a wrong room); :class:`LMScorer` wraps a causal LM.
Contexts are cut at a sentinel in the rendered chat, so any chat template works.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from .transcripts import _EXIT, _ROOM

SENTINEL = "\u0000PROBE\u0000"
ROOM_PREFIX = "You are in the"
TAKE_PREFIX = "Action: take"


@dataclass
class Probe:
    probe: str                 # room | object
    id: str                    # transcript id and action index
    game: str
    context: str               # the rendered text the model continues
    names: list[str]           # candidate names, scored as " <name><end>"
    end: str                   # what follows a name in the text ("." after a room, end of turn after an object)
    answer: str | None = None  # room: the room the text put behind the exit
    mentioned: list[str] = field(default_factory=list)  # room: names mentioned so far
    in_room: list[str] = field(default_factory=list)    # object: names that lie in the room

    def continuations(self) -> list[str]:
        return [f" {n}{self.end}" for n in self.names]


def _mentioned(vocab: Iterable[str], text: str) -> list[str]:
    return [v for v in vocab if re.search(rf"(?<![a-z]){re.escape(v)}(?![a-z])", text)]


def _split(render: Callable[[list[dict]], str], messages: list[dict], role: str, prefix: str) -> tuple[str, str]:
    """(the rendered text up to ``prefix`` in a new ``role`` turn, what the template puts after
    that turn's content up to the end of its line)."""
    text = render([*messages, {"role": role, "content": prefix + SENTINEL}])
    head, _, tail = text.partition(SENTINEL)
    return head, (tail.strip().split("\n")[0] if tail.strip() else "")


def room_vocabulary(transcripts: Iterable[dict]) -> list[str]:
    names: set[str] = set()
    for t in transcripts:
        for m in t["messages"]:
            if m["role"] == "user":
                names.update(_ROOM.findall(m["content"]))
                names.update(n for _, n in _EXIT.findall(m["content"]) if n)
    return sorted(names)


def object_vocabulary(transcripts: Iterable[dict]) -> list[str]:
    names: set[str] = set()
    for t in transcripts:
        for valid in t.get("valid_actions") or []:
            names.update(a[len("take "):] for a in valid if a.startswith("take "))
        names.update(a[len("take "):] for a in t["actions"] if a.startswith("take "))
    return sorted(names)


def room_probes(transcripts: list[dict], render: Callable[[list[dict]], str],
                vocab: list[str] | None = None) -> list[Probe]:
    """Every ``move`` whose destination an earlier observation named (and the game confirmed)."""
    vocab = room_vocabulary(transcripts) if vocab is None else vocab
    out = []
    for t in transcripts:
        msgs = t["messages"]
        room, exits = None, {}
        for i, m in enumerate(msgs):
            if m["role"] == "user":
                if (r := _ROOM.search(m["content"])):
                    room = r.group(1)
                    for d, name in _EXIT.findall(m["content"]):
                        if name:
                            exits[(room, d.lower())] = name
                continue
            if m["role"] != "assistant" or i + 1 >= len(msgs):
                continue
            action = m["content"].split("Action:")[-1].strip()
            nxt = msgs[i + 1]["content"]
            if not action.startswith("move ") or ROOM_PREFIX not in nxt:
                continue
            expected, arrived = exits.get((room, action[5:])), _ROOM.search(nxt)
            if expected is None or arrived is None or arrived.group(1) != expected:
                continue
            obs_head = nxt[:nxt.index(ROOM_PREFIX) + len(ROOM_PREFIX)]
            context, _ = _split(render, msgs[:i + 1], "user", obs_head)
            seen = "\n".join(x["content"] for x in msgs[:i + 1])
            out.append(Probe("room", f"{t['id']}#{i}", t["game"], context, list(vocab), ".",
                             answer=expected, mentioned=_mentioned(vocab, seen)))
    return out


def object_probes(transcripts: list[dict], render: Callable[[list[dict]], str],
                  vocab: list[str] | None = None) -> list[Probe]:
    """Every ``take`` in a transcript that recorded valid actions (held-out shards do), at a
    point where some takeable object is named by the current room's observations."""
    vocab = object_vocabulary(transcripts) if vocab is None else vocab
    out = []
    for t in transcripts:
        msgs, valid_lists = t["messages"], t.get("valid_actions") or []
        room_text = ""
        for k, action in enumerate(t["actions"]):
            i = 2 + 2 * k  # the assistant turn of action k (system, task, then pairs)
            obs = msgs[i - 1]["content"]
            room_text = obs if ROOM_PREFIX in obs else room_text + "\n" + obs
            if not action.startswith("take ") or k >= len(valid_lists):
                continue
            takeable = {a[len("take "):] for a in valid_lists[k] if a.startswith("take ")}
            in_room = [n for n in _mentioned(sorted(takeable), room_text)]
            if not in_room:
                continue
            seen = "\n".join(x["content"] for x in msgs[:i])
            mentioned = sorted(set(_mentioned(vocab, seen)) | set(in_room))
            names = sorted(set(vocab) | set(in_room))
            context, end = _split(render, msgs[:i], "assistant", TAKE_PREFIX)
            out.append(Probe("object", f"{t['id']}#{i}", t["game"], context, names, end,
                             in_room=in_room, mentioned=mentioned))
    return out


def select(probes: list[Probe], n: int | None) -> list[Probe]:
    """At most ``n`` probes, evenly spread over the list (deterministic)."""
    if n is None or len(probes) <= n:
        return probes
    step = len(probes) / n
    return [probes[int(k * step)] for k in range(n)]


def build_probes(transcripts: list[dict], render: Callable[[list[dict]], str],
                 room_games: Iterable[str] = ("mapreader",), object_games: Iterable[str] = ("twc",),
                 max_per_probe: int | None = 100) -> list[Probe]:
    rooms = [t for t in transcripts if t["game"] in set(room_games)]
    objects = [t for t in transcripts if t["game"] in set(object_games)]
    return (select(room_probes(rooms, render), max_per_probe)
            + select(object_probes(objects, render), max_per_probe))


# -- scoring -----------------------------------------------------------------------------------

class LMScorer:
    """Log-probabilities of continuations and greedy continuations under a causal LM."""

    def __init__(self, model, tokenizer, max_context: int | None = None, chunk: int = 16):
        import inspect

        self.model, self.tok, self.chunk = model, tokenizer, max(1, int(chunk))
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", 1024)
        # transformers 5.x names the KV cache argument `cache` (older: past_key_values)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _split_ids(self, context: str, conts: list[str]) -> tuple[list[int], list[list[int]]]:
        ctx = self._ids(context)
        out = []
        for c in conts:
            full = self._ids(context + c)
            out.append(full[len(ctx):] if full[:len(ctx)] == ctx else self._ids(c))
        longest = max((len(c) for c in out), default=0)
        keep = max(1, self.max_context - longest)
        return ctx[-keep:], out

    def logprobs(self, context: str, continuations: list[str]) -> list[float]:
        import torch

        ctx, conts = self._split_ids(context, continuations)
        was_training = self.model.training
        self.model.eval()
        scores: list[float] = []
        try:
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([ctx]), use_cache=True)
                past = getattr(out, "cache", None) or out.past_key_values
                first = torch.log_softmax(out.logits[0, -1].float(), -1)
                for start in range(0, len(conts), self.chunk):
                    part = conts[start:start + self.chunk]
                    longest = max(len(c) for c in part)
                    if longest <= 1:
                        scores += [float(first[c[0]]) for c in part]
                        continue

                    cache = copy.deepcopy(past)
                    cache.batch_repeat_interleave(len(part))
                    pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
                    rows = [c[:-1] + [pad] * (longest - len(c)) for c in part]  # right-padded: no effect on earlier positions
                    logits = self.model(input_ids=torch.tensor(rows), use_cache=True,
                                        **{self._cache_kw: cache}).logits.float()
                    logp = torch.log_softmax(logits, -1)
                    for r, c in enumerate(part):
                        scores.append(float(first[c[0]]) + sum(float(logp[r, j - 1, c[j]]) for j in range(1, len(c))))
        finally:
            self.model.train(was_training)
        return scores

    def greedy(self, context: str, max_new_tokens: int = 8) -> str:
        import torch

        ctx = self._ids(context)[-max(1, self.max_context - max_new_tokens):]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(input_ids=torch.tensor([ctx]), attention_mask=torch.ones(1, len(ctx), dtype=torch.long),
                                          max_new_tokens=max_new_tokens, do_sample=False,
                                          eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id)
        finally:
            self.model.train(was_training)
        return self.tok.decode(out[0, len(ctx):], skip_special_tokens=True)


def _argmax(names: list[str], scores: list[float]) -> str | None:
    return names[max(range(len(names)), key=lambda k: scores[k])] if names else None


def run_probes(scorer, probes: list[Probe], greedy_tokens: int = 8) -> dict[str, Any]:
    """Accuracy and chance lines of each probe kind present in ``probes``."""
    rooms = [p for p in probes if p.probe == "room"]
    objects = [p for p in probes if p.probe == "object"]
    out: dict[str, Any] = {}
    if rooms:
        hit = hit_m = 0
        for p in rooms:
            scores = dict(zip(p.names, scorer.logprobs(p.context, p.continuations())))
            hit += _argmax(p.names, [scores[n] for n in p.names]) == p.answer
            hit_m += _argmax(p.mentioned, [scores[n] for n in p.mentioned]) == p.answer
        top = Counter(p.answer for p in rooms).most_common(1)[0][1]
        out["room"] = {"n": len(rooms), "accuracy": hit / len(rooms), "accuracy_mentioned": hit_m / len(rooms),
                       "chance_majority": top / len(rooms),
                       "chance_uniform_mentioned": sum(1 / len(p.mentioned) for p in rooms) / len(rooms),
                       "candidates": len(rooms[0].names)}
    if objects:
        hit = hit_m = hit_g = 0
        for p in objects:
            scores = dict(zip(p.names, scorer.logprobs(p.context, p.continuations())))
            hit += _argmax(p.names, [scores[n] for n in p.names]) in p.in_room
            hit_m += _argmax(p.mentioned, [scores[n] for n in p.mentioned]) in p.in_room
            said = scorer.greedy(p.context, greedy_tokens).strip().split("\n")[0].strip()
            hit_g += said in p.in_room
        counts = Counter(n for p in objects for n in p.in_room)
        n = len(objects)
        out["object"] = {"n": n, "in_room_greedy": hit_g / n, "in_room": hit / n, "in_room_mentioned": hit_m / n,
                         "chance_uniform": sum(len(p.in_room) / len(p.names) for p in objects) / n,
                         "chance_uniform_mentioned": sum(len(p.in_room) / len(p.mentioned) for p in objects) / n,
                         "chance_majority": counts.most_common(1)[0][1] / n, "candidates": len(objects[0].names)}
    return out


def probes_to_rows(probes: list[Probe]) -> list[dict[str, Any]]:
    return [asdict(p) for p in probes]
