"""Every command a user page quotes runs today: docs/your_model.md and README.md's code blocks.

Each ``eto-train <stage> ...`` (also ``python -m eto_train.cli <stage>``, under ``accelerate launch`` too)
and each ``make <target> ARGS="..."`` in a fenced code block or an inline code span is composed with the
project's own configs and validated (:func:`eto_train.config.load`), as the CLI does before a stage runs;
nothing is run and no model is loaded. Shell-only parts (``N_GPUS=``, ``ACCEL=``, ``--cfg job``) are
dropped; the page's two placeholders, ``$MODEL`` and ``$SFT``, become a folder and a file the test makes;
the model config the page tells users to save (its ```yaml block, ``configs/model/my_model.yaml``)
is put on Hydra's search path, so ``model=my_model`` composes with exactly that file. Every make target
named must exist in the Makefile, and the GPU install line must be one line, the same in the page,
README.md and docs/gpu.md.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your_model.md"
USER_PAGES = [PAGE, ROOT / "README.md"]
MODEL_CONFIG = "configs/model/my_model.yaml"
FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.S | re.M)
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
    return [line for line in out if line and not line.startswith("#")]


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


def makefile_targets() -> dict[str, str | None]:
    """target -> the eto-train stage its recipe runs (``eto_train.cli <stage>`` or ``$(TRAIN) <stage>``), or None."""
    text = (ROOT / "Makefile").read_text()
    targets: dict[str, str | None] = {}
    for m in re.finditer(r"^([a-z][a-z0-9-]*):(?!=)[^\n]*\n((?:\t[^\n]*\n?)*)", text, re.M):
        stage = re.search(r"(?:eto_train\.cli|\$\(TRAIN\)) ([a-z-]+) \$\(ARGS\)", m.group(2))
        targets[m.group(1)] = stage.group(1) if stage else None
    return targets


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
    from hydra import compose, initialize_config_dir

    from eto_train.config import load
    from eto_train.envs.registry import store_plugin_configs

    store_plugin_configs(str(ROOT / "configs"))
    targets = makefile_targets()
    extra = searchpath_with_model_config(text, tmp)
    bad = []
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="user_docs"):
        for line, kind, words in commands(text):
            if only is not None and line not in only:
                continue
            bad += check(line, kind, words, targets, values, extra, lambda o: load(compose("config", overrides=o)))
    return bad


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
    else:
        from eto_train.cli import STAGES

        if words[:1] == ["--help"]:
            return []  # eto-train --help lists the stages
        if not words or words[0] not in STAGES:
            return [f"{line}: no stage {words[:1]}"]
        stage, overrides = words[0], overrides_of(words[1:])
    try:
        compose_and_load([*(expand(o, values) for o in overrides), *extra])
    except Exception as exc:  # noqa: BLE001 - any failure is the line's problem, reported with it
        why = " | ".join(part.strip() for part in str(exc).strip().splitlines())
        return [f"{line} ({stage}): {type(exc).__name__}: {why}"]
    return []


def test_the_page_quotes_commands_of_both_kinds():
    found = commands(PAGE.read_text())
    kinds = {kind for _, kind, _ in found}
    assert kinds == {"eto", "make"}, found
    assert len(found) >= 10, [line for line, _, _ in found]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.name)
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
