"""Every command a user page quotes runs today; every path it names exists; every link resolves.

User pages: README.md and every docs/ page outside the lab notebook (docs/lab/) and the studies' results
(docs/results/). Each ``eto-train <stage> ...`` (also ``python -m eto_train.cli <stage>``, under
``accelerate launch`` too) and each ``make <target> ARGS="..."`` in a fenced code block or an inline code span
is composed with the project's own configs and validated (:func:`eto_train.config.load`), as the CLI does before
a stage runs; nothing is run and no model is loaded. Shell-only parts (``N_GPUS=``, ``ACCEL=``, ``--cfg job``)
are dropped; docs/your_model.md's two placeholders, ``$MODEL`` and ``$SFT``, become a folder and a file the
test makes; the model config that page tells users to save (its ```yaml block, ``configs/model/my_model.yaml``)
is put on Hydra's search path, so ``model=my_model`` composes with exactly that file. Every make target named
must exist in the Makefile, and the GPU install line must be one line, the same in the page, README.md and
docs/gpu.md. Every repository path a user page quotes (``scripts/...``, ``configs/...``, ``docs/...``,
``lab/...``, ``src/...``, ``tests/...``) exists; every relative link of a user or lab page resolves, anchors
included. User pages open with what the reader can do, not with history, and stay short: 2,500 lines in all,
README.md 150.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your_model.md"
USER_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LAB_PAGES = sorted((ROOT / "docs" / "lab").glob("*.md"))
MODEL_CONFIG = "configs/model/my_model.yaml"
FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
INSTALL = re.compile(r"\.venv/bin/pip install [^`\n#]*")


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def shell_lines(text: str) -> list[str]:
    """The shell commands of a page: its bash / sh blocks (continuations joined; a heredoc's
    body skipped) and its inline spans that begin with ``make `` or an eto-train command."""
    out = []
    for lang, body in blocks(text):
        if lang not in ("bash", "sh", "shell"):
            continue
        heredoc = None
        for line in body.replace("\\\n", " ").splitlines():
            if heredoc is not None:
                heredoc = None if line.strip() == heredoc else heredoc
                continue
            m = re.search(r"<<-?\s*'?(\w+)'?", line)
            if m:
                heredoc = m.group(1)
            out.append(line.strip())
    outside = FENCE.sub("", text)
    out += [s for s in SPAN.findall(outside)  # a span with "..." or "<stage>" names a form, not a command
            if (s.startswith("make ") or "eto-train " in s or "eto_train.cli " in s) and not re.search(r"\.\.\.|<", s)]
    # a line with a <placeholder> (``eto-train results <the run's overrides> ...``) names a form, not a command
    return [line for line in out if line and not line.startswith("#") and not re.search(r"<[\w'][^>]*>", line)]


def commands(text: str) -> list[tuple[str, str, list[str]]]:
    """(the line, kind, words): kind ``eto`` (words: stage, overrides...) or ``make`` (words: target, then
    its VAR=value words, ARGS among them)."""
    found = []
    for line in shell_lines(text):
        if not (line.startswith("make ") or re.search(r"eto-train |eto_train\.cli ", line)):
            continue
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "make":
            found.append((line, "make", words[1:]))
            continue
        for i, w in enumerate(words):
            if Path(w).name == "eto-train":
                found.append((line, "eto", words[i + 1:]))
                break
            if w == "eto_train.cli" and i and words[i - 1] == "-m":
                found.append((line, "eto", words[i + 1:]))
                break
    return found


BENCH = "bench/config"  # make bench / bench-real: lab/bench.py composes configs/bench/config.yaml, checks `bench`


# Product scripts that hand ARGS to every stage they run (or compose the stages' config with them, as the sweep
# table does): their ARGS are checked as one stage's overrides.
ARGS_TO_STAGES = re.compile(r"scripts/(?:demo|demo_real)\.sh \$\(ARGS\)|scripts/sweep_table\.py \$\(ARGS\)")


def makefile_targets() -> dict[str, str | None]:
    """target -> the eto-train stage its recipe runs (``eto_train.cli <stage>`` or ``$(TRAIN) <stage>``; a demo
    script or the sweep table: its script; the benchmark: BENCH), or None."""
    text = (ROOT / "Makefile").read_text()
    targets: dict[str, str | None] = {}
    for m in re.finditer(r"^([a-z][a-z0-9-]*):(?!=)[^\n]*\n((?:\t[^\n]*\n?)*)", text, re.M):
        stage = re.search(r"(?:eto_train\.cli|\$\(TRAIN\)) ([a-z-]+) \$\(ARGS\)", m.group(2))
        script = ARGS_TO_STAGES.search(m.group(2))
        bench = re.search(r"lab/bench\.py [^\n]*\$\(ARGS\)", m.group(2))  # the benchmark's own primary config
        targets[m.group(1)] = (stage.group(1) if stage else script.group(0).split()[0] if script
                               else BENCH if bench else None)
    return targets


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """A multirun's jobs (``-m``): each ``key=a,b`` swept; every job when they are few, else each value once."""
    import itertools

    choices = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
               if "=" in o and "," in o.split("=", 1)[1] and "[" not in o else [o] for o in overrides]
    jobs = [list(job) for job in itertools.product(*choices)]
    if len(jobs) <= 16:
        return jobs
    return [[c[min(i, len(c) - 1)] for c in choices] for i in range(max(map(len, choices)))]


def page_values(text: str, fixture: dict[str, str]) -> dict[str, str]:
    """The shell variables a page sets in its code blocks (``X=...``, ``export X=...``), the fixture's first."""
    found = dict(re.findall(r"^[ \t]*(?:export[ \t]+)?([A-Z_][A-Z0-9_]*)=(\S+)", "\n".join(
        body for lang, body in blocks(text) if lang in ("bash", "sh", "shell")), re.M))
    return {**found, **fixture}


def overrides_of(words: list[str]) -> list[str]:
    """Hydra overrides among a command's words: flags (``--cfg job``, ``--resolve``, ``-m``) dropped."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("--cfg", "-c", "--package", "-p"):
            skip = True
        elif not w.startswith("-"):
            out.append(w)
    return out


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("user_docs")
    (where / "model").mkdir()
    sft = where / "sciworld_sft.json"
    sft.write_text("[]")
    return {"MODEL": str(where / "model"), "SFT": str(sft), "NODE_RANK": "0", "MASTER": "127.0.0.1"}


def expand(word: str, values: dict[str, str]) -> str:
    def one(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"${name}: not one of the page's placeholders ({', '.join(sorted(values))})")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, word)


def searchpath_with_model_config(text: str, folder: Path) -> list[str]:
    """The page's ```yaml model config saved where Hydra finds it as model=my_model."""
    saved = [body for lang, body in blocks(text) if lang == "yaml" and body.lstrip().startswith(f"# {MODEL_CONFIG}")]
    if not saved:
        return []
    (folder / "model").mkdir(parents=True, exist_ok=True)
    (folder / "model" / Path(MODEL_CONFIG).name).write_text(saved[0])
    return [f"hydra.searchpath=[file://{folder}]"]


def problems(text: str, values: dict[str, str], tmp: Path, only: set[str] | None = None) -> list[str]:
    """Every command of ``text`` (of ``only``, when given: those lines) that does not compose and validate,
    one line each (empty: all do)."""
    from hydra import initialize_config_dir

    from eto_train.envs.registry import store_plugin_configs

    store_plugin_configs(str(ROOT / "configs"))
    targets = makefile_targets()
    extra = searchpath_with_model_config(text, tmp)
    bad = []
    values = page_values(text, values)
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="user_docs"):
        for line, kind, words in commands(text):
            if only is not None and line not in only or line in RUN_ELSEWHERE:
                continue
            bad += check(line, kind, words, targets, values, extra, compose_and_load)
    return bad


def compose_and_load(overrides: list[str], primary: str = "config"):
    """The typed run config of ``overrides``; for the benchmark (``primary`` BENCH) its ``bench`` section checked
    as lab/bench.py checks it, and the rest as a run's config."""
    from hydra import compose
    from omegaconf import OmegaConf

    from eto_train.config import load

    cfg = compose(primary, overrides=overrides)
    if primary == BENCH:
        if str(ROOT / "lab") not in sys.path:
            sys.path.insert(0, str(ROOT / "lab"))
        from bench import check_bench  # lab/bench.py

        check_bench(cfg)
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "bench"])
    return load(cfg)


# Commands a user page quotes that need more than a checkout, each run by the test named.
RUN_ELSEWHERE = {"eto-train bc env=lamps": "tests/test_env_plugins.py (after pip install of the example plug-in)"}


def check(line, kind, words, targets, values, extra, compose_and_load) -> list[str]:
    """[] when the command composes and validates, else one line saying why not."""
    if kind == "make":
        named = [w for w in words if "=" not in w]
        assigned = dict(w.split("=", 1) for w in words if "=" in w)
        missing = [t for t in named if t not in targets]
        if missing:
            return [f"{line}: no make target {', '.join(missing)}"]
        unknown = set(assigned) - {"ARGS", "N_GPUS", "ACCEL", "PY", "TORCH", "DEMO_ARGS"}
        if unknown:
            return [f"{line}: {', '.join(sorted(unknown))}: not a variable the Makefile reads"]
        if "ARGS" not in assigned:
            return []
        if len(named) != 1 or targets[named[0]] is None:
            return [f"{line}: ARGS given to a target that runs no eto-train stage"]
        stage, overrides = targets[named[0]], shlex.split(assigned["ARGS"])
        if "-m" in overrides or "--multirun" in overrides:
            return [p for job in sweep_jobs(overrides_of(overrides))
                    for p in check(line, kind, words[:0] + [named[0], "ARGS=" + shlex.join(job)], targets, values,
                                   extra, compose_and_load)][:1]
    else:
        from eto_train.cli import STAGES

        if words[:1] == ["--help"]:
            return []  # eto-train --help lists the stages
        if not words or words[0] not in STAGES:
            return [f"{line}: no stage {words[:1]}"]
        stage, overrides = words[0], overrides_of(words[1:])
    try:
        compose_and_load([*(expand(o, values) for o in overrides), *extra], *([BENCH] if stage == BENCH else []))
    except Exception as exc:  # noqa: BLE001 - any failure is the line's problem, reported with it
        why = " | ".join(part.strip() for part in str(exc).strip().splitlines())
        return [f"{line} ({stage}): {type(exc).__name__}: {why}"]
    return []


def test_the_page_quotes_commands_of_both_kinds():
    found = commands(PAGE.read_text())
    kinds = {kind for _, kind, _ in found}
    assert kinds == {"eto", "make"}, found
    assert len(found) >= 10, [line for line, _, _ in found]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_command_composes_and_validates(page, placeholders, tmp_path):
    assert problems(page.read_text(), placeholders, tmp_path) == []


def test_a_wrong_override_key_or_target_is_caught(placeholders, tmp_path):
    """The check itself, on copies of the page: a misspelt override key, a config that does not exist, a make
    target that does not exist, a misspelt key in the model config the page has users save: each fails."""
    text = PAGE.read_text()
    original = {line for line, _, _ in commands(text)}
    edits = [("eval.policy=", "eval.polcy=", "Could not override 'eval.polcy'"),
             ("experiment=sciworld_llama2_7b_qlora_24gb", "experiment=sciworld_llama2_7b_qlora_16gb",
              "experiment/sciworld_llama2_7b_qlora_16gb"),
             ("make eto ARGS=", "make etos ARGS=", "no make target etos"),
             ("\nmax_context: 4096", "\nmax_contxt: 4096", "max_contxt")]
    for k, (old, new, why) in enumerate(edits):
        assert old in text, old
        copy = text.replace(old, new, 1)
        changed = {line for line, _, _ in commands(copy)} - original
        if not changed:  # the model config itself changed: check the commands that use it
            changed = {line for line, _, _ in commands(copy) if "model=my_model" in line}
        found = problems(copy, placeholders, tmp_path / str(k), only=set(list(changed)[:1]) if k == 3 else changed)
        assert found and all(why in p for p in found), (new, found)


def test_make_bench_args_are_checked_against_the_benchmark_s_own_config(placeholders, tmp_path):
    """make bench / bench-real hand ARGS to lab/bench.py (configs/bench/config.yaml): a run key and a bench key
    pass, a bad bench value and a misspelt key fail, each named."""
    good = 'Run `make bench ARGS="run_name=demo bench.real.enabled=false"` or `make bench-real ARGS="bench.real.threads=1"`.'
    assert problems(good, placeholders, tmp_path) == []
    bad = problems('`make bench ARGS="bench.only=nonsense"`', placeholders, tmp_path)
    assert len(bad) == 1 and "bench.only='nonsense'" in bad[0], bad
    bad = problems('`make bench-real ARGS="bench.threds=[1]"`', placeholders, tmp_path)
    assert len(bad) == 1 and "bench.threds" in bad[0], bad


def test_the_install_line_is_one_line_everywhere():
    lines = {p.name: [m.rstrip() for m in INSTALL.findall(p.read_text())]
             for p in (PAGE, ROOT / "README.md", ROOT / "docs" / "gpu.md")}
    (line,) = set(lines["your_model.md"])
    for name, found in lines.items():
        assert found and set(found) == {line}, (name, found)
    assert "-c constraints-vllm.txt" in line and "'.[gpu,vllm]'" in line


def test_user_pages_name_tools_that_exist():
    """No `huggingface-cli` (the .venv's huggingface_hub 2.4.0 has only `hf`); every script named is there."""
    for page in USER_PAGES:
        text = page.read_text()
        assert "huggingface-cli" not in text, page.name
        for script in re.findall(r"\bscripts/[\w./-]+\.(?:py|sh)\b", text):
            assert (ROOT / script).is_file(), (page.name, script)


# A path a page quotes: a word that starts at one of the repository's top folders. Forms (`<stage>`, `$(ACCEL)`,
# `*.yaml`, `{a,b}`) and the file the reader is told to create are not paths to check.
REPO_PATH = re.compile(r"(?<![\w./-])((?:scripts|configs|docs|lab|src|tests)/[\w./<>$(){}*,+-]*)")
TO_CREATE = {"configs/model/my_model.yaml"}
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def quoted_paths(text: str) -> set[str]:
    """Repository paths a page names, in code or in prose, trailing punctuation dropped."""
    found = set()
    for m in REPO_PATH.finditer(text):
        path = m.group(1).rstrip(".,:;)")
        if re.search(r"[<>$(){}*]", path) or path.endswith("/..."):
            continue
        found.add(path)
    return found - TO_CREATE


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_user_page_quotes_exists(page):
    missing = sorted(p for p in quoted_paths(LINK.sub("", page.read_text()))  # links: test_every_link_resolves
                     if not (ROOT / p.rstrip("/")).exists() and not (page.parent / p.rstrip("/")).exists())
    assert missing == [], (page.name, missing)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    for m in re.finditer(r"^#{1,6} +(.+?)\s*$", text, re.M):
        s = slug(m.group(1))
        seen[s] = seen.get(s, -1) + 1
        yield s if seen[s] == 0 else f"{s}-{seen[s]}"


@pytest.mark.parametrize("page", USER_PAGES + LAB_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    """Links between user pages, from the lab to them and back: the file is there, and so is the heading."""
    bad = []
    for href in LINK.findall(SPAN.sub("", FENCE.sub("", page.read_text()))):
        if re.match(r"^[a-z]+:", href):
            continue
        path, _, anchor = href.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            bad.append(href)
        elif anchor and target.suffix == ".md" and anchor not in set(anchors(target)):
            bad.append(href)
    assert bad == [], (str(page.relative_to(ROOT)), bad)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_user_page_opens_with_what_the_reader_can_do(page):
    """Not with history: no "Moved from the README (...)" as a page's first words."""
    first = next(p for p in page.read_text().split("\n\n")[1:] if p.strip())
    assert not re.match(r"\s*(Moved from|Until |Formerly|Before issue)", first), (page.name, first[:80])


def test_the_user_docs_stay_short():
    lines = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in USER_PAGES}
    assert lines[Path("README.md")] <= 150
    assert sum(lines.values()) <= 2500, lines
