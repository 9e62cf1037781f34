"""Where everything of a run lives: one home for the run folder's paths and names.

The roots come from the config's ``paths`` section (``run``, ``base``, ``experts``, ``bc``,
``bc_eval``, ``eto``, ``compare``, ``cache``); the names inside them are the constants and
methods here, so no stage spells a folder name of its own. The tree (README's "Run folder")::

    <run>/experts/train.jsonl            RunLayout.experts
    <run>/bc/model/                      RunLayout.bc_policy
    <run>/eval/<tag>/<split>/            RunLayout.evaluation(tag) / split  (tag "bc": paths.bc_eval)
    <run>/eto/iter<k>/                   RunLayout.iteration(k): explore/ pairs/ dpo/ eval/ summary.json
    <run>/eto/result.json                RunLayout.eto_result
    <run>/compare/<variant>/             the same explore/ (explore_step/) pairs/ dpo/ inside, per variant
    <run>/compare/control/ eval/<name>/  compare's SFT control and every policy's evaluation
    <run>/compare/compare.{json,md,png}  compare_file(out, ".json")
    <run>/reading/<split>.json           RunLayout.reading(split)
    <run>/report.{json,md}               REPORT, with ITERATION_PLOT
    <run>/logs/                          LOGS
    <run>/seed<k>/  <run>/seeds.{json,md}  with ``seeds``: each seed's whole run (seed_run), and their aggregate
    <run>/cache/<kind>/<hash>/           RunLayout.cache(kind, key): finished work reused by content
    <stage>/manifest.json                manifest(stage_dir): every stage's record (MANIFEST)

Under a Hydra multirun (:func:`isolate_sweep_job`) every job gets its own ``run`` folder, and
shares ``base`` (experts, the tiny model, BC and its evaluation, the cache) with the other jobs
for the stages whose settings it does not vary (:func:`job_paths`, :data:`SHARES_BC`); a record of the sweep's
jobs (:data:`SWEEP_RECORD`) is written before the first runs (sweeps.py).

The repository's own folders (``configs/``, the shipped ``data/`` and ``models/``) are found from
:data:`REPO_ROOT`, the one place that knows where the checkout is.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# The checkout this package runs from (an editable install: src/eto_train/ -> the repository).
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "configs"     # the Hydra config tree (cli.configs_dir: unless $ETO_TRAIN_CONFIGS)
UNTUNED = "untuned"  # eval.tag of the model before BC (the paper's untuned rows): eto-train eval eval.tag=untuned


def from_repo(path: str | Path, exists=Path.exists) -> Path:
    """``path`` as given when it exists there (scripts run from the repository root), else the same
    relative path under :data:`REPO_ROOT` (tests and other working folders): a config's shipped
    ``data/...`` is found from anywhere."""
    p = Path(path)
    return REPO_ROOT / p if not p.is_absolute() and not exists(p) else p


# -- the run folder's name and its root: checked before anything is written ----------------------------

def run_name_problem(name: str) -> str | None:
    """Why ``run_name`` cannot name a folder inside ``paths.runs`` (None when it can): it is a
    relative path of plain names (``demo``, ``study/seed3``); ``..``, ``.``, an empty name or an
    absolute path would put the run's files elsewhere (``run_name=../../tmp/x`` wrote outside it)."""
    name = str(name)
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or not name:
        bad = "an absolute path" if name else "empty"
    elif ".." in parts:
        bad = "its '..' leaves paths.runs"
    elif any(p in ("", ".") for p in parts):
        bad = "a '.' or empty part"
    else:
        return None
    return f"{bad}; a run's name is a folder name inside paths.runs, or names joined by '/' (demo, study/seed3)"


def not_a_folder(path: str | Path) -> Path | None:
    """The nearest existing part of ``path`` (itself or a parent) when it is not a folder (a regular
    file where a folder must be made), else None."""
    p = Path(path).absolute()
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    return None if p.is_dir() else p


def check_run_folder(cfg) -> None:
    """``run_name`` and ``paths.runs`` / ``paths.run`` can hold a run: one
    :class:`~eto_train.errors.ConfigError` naming the value (exit 2) before any folder is made."""
    from omegaconf import OmegaConf

    from .errors import ConfigError

    lines = []
    name = OmegaConf.select(cfg, "run_name", default=None)
    why = run_name_problem(str(name)) if name is not None else None
    if why:
        runs = OmegaConf.select(cfg, "paths.runs", default="runs")
        lines.append(f"run_name={name}: {why}; its folder would be {os.path.normpath(Path(runs).absolute() / str(name))}, "
                     f"outside paths.runs={runs}")
    for key in ("paths.runs", "paths.run"):
        try:
            value = OmegaConf.select(cfg, key, default=None)
        except Exception:  # an interpolation the typed config names
            continue
        blocker = not_a_folder(value) if value is not None else None
        if blocker is not None:
            lines.append(f"{key}={value}: {blocker} is a regular file, not a folder; point {key} at a folder "
                         f"(e.g. {key}=runs) or move the file away")
            break
    if lines:
        raise ConfigError(lines)


# -- names inside any stage's folder -----------------------------------------------------------------
MANIFEST = "manifest.json"    # every stage's record (manifest.py): config hash, status, outputs
POLICY = "model"              # a training stage's policy (one plain checkpoint) inside its folder
CHECKPOINTS = "checkpoints"   # a training stage's Trainer checkpoints (TRL's output_dir) inside its folder
ADAPTER = "adapter"           # a LoRA stage's adapter, beside its merged policy (training/save.py)
PAIRS_DATASET = "pairs_dataset"  # a data-parallel DPO stage's flattened pairs (training/recipe.py)
TRAINING_OUTPUTS = (POLICY, CHECKPOINTS, ADAPTER)  # what a training stage writes (its manifest's outputs)
TRAINER_STATE = "trainer_state.json"  # transformers' record inside each checkpoint-<step>/
EPISODES = "episodes.jsonl"   # a rollout's episodes (one record per line)
GZ = ".gz"                    # a results folder's compressed copies (results.py): episodes.jsonl.gz
METRICS = "metrics.json"      # an evaluation's metrics beside its episodes
SHARDS = "shards"             # a data-parallel rollout's bookkeeping in its work folder: plan.json, rank<r>.jsonl
PLAN = "plan.json"
PAIRS = "pairs.jsonl"         # a pairs stage's pairs (+ STATS)
STATS = "stats.json"          # a pairs stage's counts beside its pairs
SUMMARY = "summary.json"      # an ETO iteration's summary
RESULT = "result.json"        # the ETO loop's result

# -- folder and file names of the run folder -----------------------------------------------------------
EVAL = "eval"                 # <run>/eval/<tag>/, <iteration>/eval/, <compare>/eval/<policy>/
EXPLORE = "explore"           # an iteration's (or a contrast variant's) exploration
EXPLORE_STEP = "explore_step"  # ... and its step-level continuations (eto.pairs.contrast: step, mixture)
EXPLORE_VALUE = "explore_value"  # ... and its sampled continuations that value steps (contrast: step_value)
PAIRS_DIR = "pairs"
DPO = "dpo"
CONTROL = "control"           # compare's SFT control, in <compare>/
COMPARE = "compare"           # compare's result: COMPARE.json, .md, .png in <compare>/
READING = "reading"           # <run>/reading/<split>.json
REPORT = "report"             # the demo's report: <run>/report.json, report.md and ITERATION_PLOT
ITERATION_PLOT = "success_vs_iteration.png"
LOGS = "logs"                 # <run>/logs/: every command's log (cli.py)
SWEEP_RECORD = "sweep.json"   # <run>/sweep.json: a multirun's jobs, written before the first runs (sweeps.py)
SEEDS = "seeds"               # with `seeds`: <run>/seeds.{json,md}, the seeds aggregated (seeds.py); runs in SEED_RUN
UNIT = "unit.json"            # a results folder's record of the unit it holds: machine, versions, commit (results.py)
SEED_RUN = "seed{seed}"       # seed k's own run folder, <run>/seed<k>/ (its own base: experts, model, BC, cache)
# pretraining (<pretrain>/): tokens/ (TOKENIZER, TRAIN_TOKENS, HELDOUT_TOKENS), then model/ + PROBES, PROGRESS
TOKENS = "tokens"
TOKENIZER = "tokenizer"
TRAIN_TOKENS = "train.bin"
HELDOUT_TOKENS = "heldout.bin"
PROBES = "probes.json"
PROGRESS = "progress.json"
LOSS_PLOT = "loss.png"        # inside the pretrained model's folder, with MODEL_CARD
MODEL_CARD = "MODEL_CARD.md"

# Which stage folders of ``paths.base`` a sweep's jobs share (:func:`job_paths`): a job shares experts, the
# model and BC when every key it varies is in a section none of them reads (:data:`SHARES_BC`), and BC's
# evaluations too when no varied key is in ``rollout`` or ``eval`` either (:data:`SHARES_BC_EVAL`). Any other key
# (bc, env, model, prompt, experts, seed, paths, a section added later...) gives the job its own base: a list of
# what may be shared, so a new section is never shared by mistake. The cache is content-addressed: always shared.
# (run_name: a job of another run_name is in another sweep folder, whose base it shares with its own jobs only)
SHARES_BC_EVAL = ("eto", "compare", "reading", "export", "wandb", "runtime", "hydra", "run_name")
SHARES_BC = (*SHARES_BC_EVAL, "rollout", "eval")


@dataclass(frozen=True)
class RunLayout:
    run: Path
    base: Path
    experts: Path
    bc: Path
    bc_eval: Path
    eto: Path
    compare: Path
    cache_root: Path

    @classmethod
    def of(cls, cfg) -> RunLayout:
        p = cfg.paths
        return cls(run=Path(p.run), base=Path(p.base), experts=Path(p.experts), bc=Path(p.bc),
                   bc_eval=Path(p.bc_eval), eto=Path(p.eto), compare=Path(p.compare), cache_root=Path(p.cache))

    @property
    def bc_policy(self) -> Path:
        return self.bc / POLICY

    def evaluation(self, tag: str) -> Path:
        """A policy's evaluations (``<split>/episodes.jsonl``): BC's are shared by a sweep's jobs."""
        return self.bc_eval if tag == "bc" else self.run / EVAL / tag

    def reading(self, split: str) -> Path:
        """The reading report of ``split`` (``make reading``)."""
        return self.run / READING / f"{split}.json"

    def iteration(self, k: int) -> Path:
        return self.eto / f"iter{k}"

    @property
    def eto_result(self) -> Path:
        return self.eto / RESULT

    def cache(self, kind: str, key: str | None = None) -> Path:
        """Finished work of ``kind`` (explore, dpo) by content hash, shared by a sweep's jobs."""
        return self.cache_root / kind / key if key else self.cache_root / kind


# -- inside an iteration (or a contrast variant) folder --------------------------------------------

def explore_dir(out: Path) -> Path:
    return out / EXPLORE


def explore_step_dir(out: Path) -> Path:
    return out / EXPLORE_STEP


def explore_value_dir(out: Path) -> Path:
    return out / EXPLORE_VALUE


def pairs_file(out: Path) -> Path:
    return out / PAIRS_DIR / PAIRS


def pairs_stats(out: Path) -> Path:
    return out / PAIRS_DIR / STATS


def dpo_dir(out: Path) -> Path:
    return out / DPO


def evaluations(out: Path) -> Path:
    """The evaluations inside an iteration or compare folder (``<out>/eval/``)."""
    return out / EVAL


def compare_file(out: Path, suffix: str) -> Path:
    """Compare's result in ``out``: ``compare.json``, ``compare.md``, ``compare.png``."""
    return out / f"{COMPARE}{suffix}"


def seed_run(folder: str | Path, seed: int) -> Path:
    """Seed ``seed``'s folder inside a run (or base) folder, with ``seeds``: ``<folder>/seed<k>``."""
    return Path(folder) / SEED_RUN.format(seed=seed)


def seeds_file(run: str | Path, suffix: str) -> Path:
    """The seeds' aggregate in the run folder: ``seeds.json``, ``seeds.md``."""
    return Path(run) / f"{SEEDS}{suffix}"


def manifest(stage_dir: str | Path) -> Path:
    """The manifest of the stage in ``stage_dir``."""
    return Path(stage_dir) / MANIFEST


def shard(work: Path, rank: int) -> Path:
    """Rank ``rank``'s episodes of a data-parallel rollout (in the stage's work folder)."""
    return work / SHARDS / f"rank{rank}.jsonl"


def policy(stage_dir: str | Path) -> Path:
    """The policy a training stage wrote in ``stage_dir``."""
    return Path(stage_dir) / POLICY


def checkpoints(stage_dir: str | Path) -> Path:
    """The Trainer checkpoints of a training stage in ``stage_dir`` (its TRL arguments' ``output_dir``)."""
    return Path(stage_dir) / CHECKPOINTS


def episodes(folder: Path, split: str | None = None) -> Path:
    """A rollout's episodes file; in a study's results folder (results.py), where only the compressed copy is
    kept, that copy (``episodes.jsonl.gz``, which store.read_jsonl reads)."""
    plain = (Path(folder) / split if split else Path(folder)) / EPISODES
    packed = plain.with_name(EPISODES + GZ)
    return packed if not plain.exists() and packed.exists() else plain


# -- which stage rebuilds a damaged output ---------------------------------------------------------

# a stage's name (its manifest's "stage", first part) -> the command that runs it again
REBUILD = {"experts": "make experts", "model": "make model", "bc": "make bc", "pretrain": "make pretrain",
           "dpo": "make eto", "explore": "make eto", "explore-step": "make compare-contrast",
           "compare": "make compare-contrast"}


def writer_stage(path: str | Path) -> str | None:
    """The finished stage whose recorded output ``path`` is (``<stage folder>/<output>``, the
    stage's "done" manifest beside it listing it), or None."""
    import json

    path = Path(path)
    try:
        m = json.loads(manifest(path.parent).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("status") != "done" or not isinstance(m.get("stage"), str) \
            or path.name not in (m.get("output_files") or {}):  # manifest.OUTPUT_FILES
        return None
    return m["stage"]


def rebuild_hint(path: str | Path) -> str | None:
    """"Re-run `make bc` (stage bc)" for an output of a finished stage; None for any other file.
    Rerunning it redoes the stage, since a finished stage re-checks its outputs (manifest.Stage.done)."""
    stage = writer_stage(path)
    if stage is None:
        return None
    head = stage.split("/", 1)[0]
    if head == "eval":  # eval/<tag>/<split>: BC's by `make eval`; the others by the stage that evaluates them
        tag = (stage.split("/") + [""])[1]
        cmd = ("make eval" if tag == "bc" else "make eto" if tag == "eto_best" or tag.startswith("iter")
               else f"make eval ARGS='eval.tag={tag} eval.policy=<its policy>'")
    else:
        cmd = REBUILD.get(head, f"eto-train {head}")
    return f"Re-run `{cmd}` (stage {stage})"


# -- sweeps -----------------------------------------------------------------------------------------

def swept_keys(overrides: list[str]) -> set[str]:
    """The keys a command line sweeps (``key=a,b``, ``range(...)``, ``choice(...)``), Hydra's ``hydra.*`` left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(
        [a for a in overrides if "=" in a and not a.startswith(("-", "hydra."))])
    return {o.key_or_group for o in parsed if o.is_sweep_override()}


def job_swept(job_overrides: list[str], swept: set[str]) -> list[str]:
    """A job's overrides of the swept keys, sorted (``eto.dpo.beta=0.5``): they name its folder."""
    return sorted(o for o in job_overrides if o.split("=", 1)[0].lstrip("+~") in swept)


def job_folder(swept: list[str], num: int) -> str:
    """A job's run folder's name inside the sweep's: its swept values (Hydra's ``override_dirname``
    lists the fixed overrides too and soon exceeds a file name's length), else ``job<num>``."""
    name = ",".join(swept).replace("/", "_")
    return name if name and len(name) <= 200 else f"job{num}"


def _varies(overrides: list[str], shared: tuple[str, ...]) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] not in shared for o in overrides)


def job_paths(cfg, swept: list[str], num: int, explicit_base: bool) -> None:
    """Point ``cfg``'s (a DictConfig, open) paths at the job's: ``paths.run`` is
    ``<the sweep's run>/<job_folder>``; the base stays the sweep's run folder (experts, the model, BC
    trained once) unless the job varies a key outside :data:`SHARES_BC` (then the job's own folder, via
    ``paths.base: ${paths.run}``) or ``paths.base`` is given; BC's evaluations move into the job's folder
    when it varies ``rollout`` or ``eval`` (how a policy plays: they would be played again over each other)."""
    shared = cfg.paths.run
    cfg.paths.run = f"{shared}/{job_folder(swept, num)}"
    if explicit_base:
        return
    if not _varies(swept, SHARES_BC):
        cfg.paths.base = shared
        if _varies(swept, SHARES_BC_EVAL) and cfg.paths.bc_eval == f"{shared}/{EVAL}/bc":
            cfg.paths.bc_eval = f"{cfg.paths.run}/{EVAL}/bc"


def isolate_sweep_job(cfg) -> None:
    """Under a Hydra multirun, give each job its own run folder (:func:`job_paths`); a plain run is
    left untouched."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    task = list(hc.overrides.task)
    with open_dict(cfg):
        job_paths(cfg, job_swept(task, swept_keys(sys.argv[1:])), hc.job.num,
                  any(o.lstrip("+~").startswith("paths.base=") for o in task))


# -- whose folder: a finished stage of another run is not replaced in place (manifest.check_owner) -----------
_OWN_RUN: list[Path] = []  # the run folder of this command (cli.py); empty: no check (a script, a test)


@contextmanager
def own_run(folder: str | Path) -> Iterator[None]:
    """While it lasts, ``folder`` is this command's run folder (``paths.run`` before a sweep job's isolation):
    stage folders outside it belong to another run (:func:`another_runs`)."""
    before = list(_OWN_RUN)
    _OWN_RUN[:] = [Path(folder).absolute()]
    try:
        yield
    finally:
        _OWN_RUN[:] = before


def another_runs(folder: str | Path) -> Path | None:
    """This command's run folder when ``folder`` lies outside it (another run's, e.g. through
    ``paths.base``), else None (inside it, or no run claimed)."""
    if not _OWN_RUN:
        return None
    own, path = (Path(os.path.normpath(p)) for p in (_OWN_RUN[0], Path(folder).absolute()))
    return None if path == own or own in path.parents else own
