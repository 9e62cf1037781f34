"""The model card of a pretrained base (``MODEL_CARD.md`` beside its weights) and its loss curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .train import PROBE


def plot_loss(log_history: list[dict[str, Any]], path: str | Path) -> None:
    """Training loss (every logging step) and held-out loss (every probe) against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    held = [(e["step"], e[f"{PROBE}heldout_loss"]) for e in log_history if f"{PROBE}heldout_loss" in e]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="training loss", lw=1.2)
    if held:
        ax.plot(*zip(*held), "o-", label="held-out loss", lw=1.2, ms=3)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("next-token loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def probe_table(log_history: list[dict[str, Any]]) -> list[str]:
    rows = [e for e in log_history if f"{PROBE}seconds" in e]
    if not rows:
        return ["(no probes were run)"]
    g = lambda e, k: e.get(f"{PROBE}{k}")
    lines = ["| step | tokens | held-out loss | room: argmax (all / mentioned) | room chance (majority / uniform mentioned) "
             "| object in room: greedy | object: argmax all (chance) | object: argmax mentioned (chance) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in rows:
        hl = g(e, "heldout_loss")
        lines.append(
            f"| {e['step']} | {e.get('tokens', 0):,} | {'' if hl is None else f'{hl:.3f}'} "
            f"| {_pct(g(e, 'room/accuracy'))} / {_pct(g(e, 'room/accuracy_mentioned'))} "
            f"| {_pct(g(e, 'room/chance_majority'))} / {_pct(g(e, 'room/chance_uniform_mentioned'))} "
            f"| {_pct(g(e, 'object/in_room_greedy'))} "
            f"| {_pct(g(e, 'object/in_room'))} ({_pct(g(e, 'object/chance_uniform'))}) "
            f"| {_pct(g(e, 'object/in_room_mentioned'))} ({_pct(g(e, 'object/chance_uniform_mentioned'))}) |")
    last = rows[-1]
    n_room, n_obj = g(last, "room/n"), g(last, "object/n")
    lines.append("")
    lines.append(f"Probe sizes: {n_room or 0} room probes (mapreader moves), {n_obj or 0} object probes (twc takes); "
                 "see `src/eto_train/pretrain/probes.py` for the definitions.")
    return lines


def write_card(path: str | Path, info: dict[str, Any]) -> None:
    """``info``: name, command, parameters, arch, vocab_size, seq_len, data (the data stage's
    summary), settings, seeds, tokens (train/heldout), train (config), steps, tokens_seen,
    seconds (data, tokens, train, total), tokens_per_second, final_loss, log_history, threads,
    resumed_from, loss_png, sha256 (file name -> hex digest of the base's files)."""
    data, tr = info["data"], info["train"]
    lines = [
        f"# {info['name']}: a text-game base model pretrained from scratch",
        "",
        f"A {info['parameters'] / 1e6:.2f}M-parameter Llama (hidden {info['arch']['hidden_size']}, "
        f"{info['arch']['num_layers']} layers, {info['arch']['num_heads']} heads, intermediate "
        f"{info['arch']['intermediate_size']}, context {info['arch']['max_position_embeddings']}) with a "
        f"byte-level BPE vocabulary of {info['vocab_size']} tokens and the ChatML template, trained with "
        "next-token loss on every token of TextWorldExpress transcripts rendered in the policy's chat layout "
        "(system turn with the action forms, `Task:` + first observation, `Action: ...` turns, observation turns). "
        "Built by `make pretrain` (eto-train); nothing was downloaded.",
        "",
        "Use it as the policy's starting point: "
        f"`make bc ARGS=\"model.path={info['model_dir']} model.build=false\"`.",
        "",
        "## Command",
        "",
        f"```\n{info['command']}\n```",
        "",
        "## Data",
        "",
        f"{data['train']['transcripts']:,} training transcripts from {data['train']['tasks']:,} tasks "
        f"({info['tokens']['train']:,} tokens), {data['heldout']['transcripts']:,} held-out transcripts "
        f"({info['tokens']['heldout']:,} tokens) for the held-out loss and the probes.",
        "",
        "| kind | transcripts | actions | invalid actions | won | characters |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, c in data["train"]["by_kind"].items():
        lines.append(f"| {kind} | {c['transcripts']:,} | {c['actions']:,} | {c['invalid_actions']:,} "
                     f"| {_pct(c['won'] / max(1, c['transcripts']))} | {c['chars']:,} |")
    lines += ["", "| game | transcripts | actions | won | characters |", "| --- | --- | --- | --- | --- |"]
    for game, c in data["train"]["by_game"].items():
        lines.append(f"| {game} | {c['transcripts']:,} | {c['actions']:,} | {_pct(c['won'] / max(1, c['transcripts']))} "
                     f"| {c['chars']:,} |")
    lines += ["", "Settings (game and TextWorldExpress parameters):", ""]
    lines += [f"- `{s['game']}` `{s['params'] or '(defaults)'}`" + (f", {s['tasks']} tasks" if s.get("tasks") else "")
              for s in info["settings"]]
    seeds = info["seeds"]
    lines += [
        "",
        "Seeds are positions in each game's list of valid seeds of a fold. Training transcripts: "
        + "; ".join(f"{f} fold {', '.join(f'{a}-{b}' for a, b in r)}" for f, r in seeds["train"].items())
        + ". Held-out: " + "; ".join(f"{f} fold {', '.join(f'{a}-{b}' for a, b in r)}" for f, r in seeds["heldout"].items())
        + ". Never played here (the env splits: BC's training tasks, dev, seen, unseen, test_seen, test_unseen): "
        + "; ".join(f"{f} fold {', '.join(f'{a}-{b}' for a, b in r)}" for f, r in seeds["excluded"].items())
        + ". The dev fold (unseen objects) is never used.",
        "",
        "Transcript kinds: `gold` (the gold path; for coin and multi-room twc a seeded explorer, since "
        "TextWorldExpress's own gold agents there are unseeded random walks), `random` (random actions, a share "
        "of them invalid), `detour` (the gold path with random detours, then resumed or replanned).",
        "",
        "## Training",
        "",
        f"- {info['steps']:,} optimizer steps of {tr['batch_size']} x {tr.get('grad_accum', 1)} packed blocks of "
        f"{info['seq_len']} tokens: {info['tokens_seen']:,} tokens seen "
        f"({info['tokens_seen'] / max(1, info['tokens']['train']):.2f} epochs of the training tokens)",
        f"- AdamW, lr {tr['lr']} ({tr.get('scheduler', 'cosine')}, warmup {tr.get('warmup_ratio', 0)}), weight decay "
        f"{tr.get('weight_decay', 0)}, beta2 {tr.get('adam_beta2', 0.999)}, gradient clip {tr.get('max_grad_norm', 1.0)}",
        f"- final training loss {info['final_loss']:.4f}" if info.get("final_loss") is not None else "- no training loss logged",
        f"- wall time: data {info['seconds']['data']:.0f} s, tokenizer and tokens {info['seconds']['tokens']:.0f} s "
        "(when they were made), training "
        f"{info['seconds']['train']:.0f} s of which probes {info['seconds']['probes']:.0f} s "
        f"({info['tokens_per_second']:,.0f} tokens/s without the probes, {info['threads']} torch threads)"
        + (f", resumed from {info['resumed_from']} (training time and tokens/s of the steps after it)"
           if info.get("resumed_from") else ""),
        "",
        f"![loss curve]({info['loss_png']})",
        "",
        "## Reading probes (held-out transcripts)",
        "",
        "room: after `move <dir>`, is the most likely room name the one an earlier observation put behind that "
        "exit? object: at `Action: take`, does the model name an object that lies in the room?",
        "",
        *probe_table(info["log_history"]),
        "",
    ]
    if info.get("sha256"):
        lines += ["## Files", "",
                  "A rebuild by the command above is the same base when these hashes match (`sha256sum`):", ""]
        lines += [f"- `{name}` `{digest}`" for name, digest in info["sha256"].items()]
        lines.append("")
    Path(path).write_text("\n".join(lines))
