"""The wheels of scripts/gpu_smoke.sh for a GPU machine without internet: fetched here, installed there.

    python scripts/gpu_smoke_wheels.py download [--python 3.12] [--skip numpy,pandas] [--platform TAG ...]
    python3 scripts/gpu_smoke_wheels.py status      # which pins this python lacks (or has at other versions)
    python3 scripts/gpu_smoke_wheels.py install     # bundle -> /tmp/eto_gpu_smoke/site-packages (PYTHONPATH)
    python3 scripts/gpu_smoke_wheels.py check       # every listed package present, their requirements met

``download`` (PyPI reachable) runs ``pip download --only-binary=:all: --no-deps`` for every pin of
scripts/gpu_smoke_wheels.txt for the target python and platform, then packs them into one file,
``.whl/gpu_smoke_wheels.tar.xz``, for the ``run`` tool's ``carry`` (64 MiB at most, the working
tree included). The wheels as PyPI serves them are about 106 MiB; packed: each wheel is re-stored uncompressed (ZIP_STORED:
pip installs it the same way, RECORD hashes are of the files, not of the archive), pyarrow's
libraries that datasets never loads are left out (Flight, S3, headers, tests; ``PYARROW_DROP``),
and xz compresses the lot, which it does far better than a wheel's file-by-file deflate: 48.8 MiB
for python 3.12; 31.8 MiB with ``--skip numpy,pandas`` for a machine that has those (the H200
image does; ``check`` then verifies the versions it has against what the others require).

``install`` (the GPU machine: python3 and a CUDA torch, stdlib only until pip runs) unpacks the
bundle and installs the wheels with ``pip install --no-index --no-deps --target <site>``: no
index, no resolver, the machine's torch untouched (torch is not in the list). Without pip it
extracts the wheels itself (a wheel is a zip of its installed files). The package itself is not
installed: the smoke puts ``src`` on PYTHONPATH (the same code as ``pip install --no-deps -e .``,
with no build backend needed offline, and the tokenizer fixtures under tests/data are found).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "scripts" / "gpu_smoke_wheels.txt"
WHL = ROOT / ".whl"
BUNDLE = WHL / "gpu_smoke_wheels.tar.xz"
# Outside .whl (never carried back and forth), and named site-packages on purpose: dill pickles a
# module by value unless its file lies under sys.prefix or a path with 'site-packages' in it
# (dill/_dill.py:1689-1705, _is_builtin_module), and datasets' fingerprint (dill, recurse=True)
# then walks pyarrow's namespace and fails: "Can't pickle <class 'MonthDayNano'>".
SITE = Path(tempfile.gettempdir()) / "eto_gpu_smoke" / "site-packages"
CARRY_LIMIT = 64 * 2**20  # the run tool's limit on what travels: the working tree and carried paths together
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_12_x86_64", "manylinux2010_x86_64"]
# Pinned distributions PyPI serves only as a source archive, all pure Python: built into a py3-none-any
# wheel here (``pip wheel --no-deps``), which installs anywhere. omegaconf's parser runtime is one.
SDIST_ONLY = {"antlr4-python3-runtime"}
# pyarrow members datasets never loads (checked with readelf: lib.so needs neither; pyarrow.fs
# imports _s3fs in a try block): Flight RPC, the S3 filesystem, C++ headers and sources, tests
PYARROW_DROP = ["pyarrow/libarrow_flight.so*", "pyarrow/libarrow_python_flight.so*", "pyarrow/_flight.*",
                "pyarrow/libarrow_s3.so*", "pyarrow/_s3fs.*", "pyarrow/include/*", "pyarrow/src/*",
                "pyarrow/tests/*"]


def pins(path: Path = LIST) -> list[str]:
    """The ``name==version`` lines of the wheel list."""
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def status() -> list[str]:
    """The pins whose distribution this python lacks, or has at another version."""
    from importlib.metadata import PackageNotFoundError, version

    missing = []
    for pin in pins():
        name, want = pin.split("==")
        try:
            if version(name) != want:
                missing.append(f"{pin} (found {version(name)})")
        except PackageNotFoundError:
            missing.append(pin)
    return missing


def check() -> tuple[list[str], list[str]]:
    """After an install: (problems, kept). A problem is a listed distribution this python lacks,
    or a requirement of one (its Requires-Dist, markers evaluated here) that the versions found
    do not meet; ``kept`` names the listed ones that run at this machine's own version (left out
    of the bundle with --skip, e.g. the image's numpy)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    problems, kept, found = [], [], {}
    for pin in pins():
        name, want = pin.split("==")
        try:
            found[_key(name)] = distribution(name)
        except PackageNotFoundError:
            problems.append(f"{name}: not installed")
            continue
        if found[_key(name)].version != want:
            kept.append(f"{name} {found[_key(name)].version} (pinned {want})")
    for key, dist in found.items():
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = found.get(_key(req.name))
            if have is None:
                try:
                    have = distribution(req.name)
                except PackageNotFoundError:
                    continue  # a need of no part the smoke runs (every install is --no-deps): left out on purpose
            if not req.specifier.contains(have.version, prereleases=True):
                problems.append(f"{dist.metadata['Name']} needs {req}, found {req.name} {have.version}")
    return problems, kept


def _restore(src: Path, dst: Path, drop: list[str]) -> int:
    """Rewrite wheel ``src`` as an uncompressed zip at ``dst`` without the members matching ``drop``
    (and their RECORD lines); returns the bytes left out."""
    dropped = 0
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        gone = {i.filename for i in z.infolist() if any(fnmatch.fnmatch(i.filename, p) for p in drop)}
        for info in z.infolist():
            if info.filename in gone:
                dropped += info.file_size
                continue
            data = z.read(info)
            if info.filename.endswith(".dist-info/RECORD") and gone:
                data = "".join(ln for ln in data.decode().splitlines(keepends=True)
                               if ln.split(",")[0] not in gone).encode()
            info.compress_type = zipfile.ZIP_STORED
            out.writestr(info, data)
    return dropped


def download(python: str, platforms: list[str], bundle: Path = BUNDLE, preset: int = 9,
             skip: tuple[str, ...] = ()) -> dict:
    """Fetch every pinned wheel for ``python`` / ``platforms`` (but ``skip``: distributions the
    target machine has already) and pack them into ``bundle``."""
    with tempfile.TemporaryDirectory() as tmp:
        raw, stored = Path(tmp, "raw"), Path(tmp, "stored")
        stored.mkdir()
        cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--dest", str(raw),
               "--python-version", python, "--implementation", "cp"]
        for p in platforms:
            cmd += ["--platform", p]
        wanted = [p for p in pins() if _key(p.split("==")[0]) not in {_key(k) for k in skip}]
        built = [p for p in wanted if _key(p.split("==")[0]) in {_key(k) for k in SDIST_ONLY}]
        subprocess.run(cmd + [p for p in wanted if p not in built], check=True)
        if built:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(raw), *built],
                           check=True)
            impure = [w.name for w in raw.glob("*.whl") if _key(w.name.split("-")[0]) in
                      {_key(p.split("==")[0]) for p in built} and not w.name.endswith("-py3-none-any.whl")]
            if impure:
                raise SystemExit(f"built here but not pure Python (would not install there): {impure}")
        wheels = sorted(raw.glob("*.whl"))
        names = {_key(w.name.split("-")[0]) for w in wheels}
        lacking = [p for p in wanted if _key(p.split("==")[0]) not in names]
        if lacking:
            raise SystemExit(f"no wheel downloaded for {lacking}")
        info = {"python": python, "platforms": platforms, "skipped": sorted(skip), "wheels": {}, "dropped_bytes": 0}
        for w in wheels:
            drop = PYARROW_DROP if w.name.startswith("pyarrow-") else []
            info["dropped_bytes"] += _restore(w, stored / w.name, drop)
            info["wheels"][w.name] = w.stat().st_size
        info["wheel_bytes"] = sum(info["wheels"].values())
        (stored / "bundle.json").write_text(json.dumps(info, indent=1))
        bundle.parent.mkdir(parents=True, exist_ok=True)
        print(f"packing {len(wheels)} wheels ({info['wheel_bytes'] / 2**20:.1f} MiB as served) into {bundle} "
              f"(xz, a few minutes) ...", flush=True)
        with tarfile.open(bundle, "w:xz", preset=preset) as tar:
            for f in sorted(stored.iterdir()):
                tar.add(f, arcname=f.name)
    info["bundle_bytes"] = bundle.stat().st_size
    (bundle.parent / "bundle.json").write_text(json.dumps(info, indent=1))
    print(f"{bundle}: {info['bundle_bytes'] / 2**20:.1f} MiB for python {python}; with the working tree it "
          f"must stay under {CARRY_LIMIT / 2**20:.0f} MiB (git ls-files | xargs du -cb)")
    return info


def install(bundle: Path = BUNDLE, site: Path = SITE) -> None:
    """Unpack ``bundle`` and install its wheels into ``site`` (the machine's torch is left alone)."""
    if not bundle.is_file():
        raise SystemExit(f"{bundle}: no wheel bundle; on a machine with internet run "
                         f"`bash scripts/gpu_smoke.sh --download-wheels --python X.Y` and carry .whl")
    if "site-packages" not in str(site):
        raise SystemExit(f"{site}: the install folder's path must contain 'site-packages' (see SITE)")
    shutil.rmtree(site, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(bundle) as tar:
            tar.extractall(tmp)
        info = json.loads(Path(tmp, "bundle.json").read_text())
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if info["python"] != here:
            raise SystemExit(f"{bundle} holds wheels for python {info['python']}, this is python {here}: "
                             f"rebuild it with --download-wheels --python {here}")
        wheels = sorted(str(w) for w in Path(tmp).glob("*.whl"))
        has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
        if has_pip:
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links", tmp,
                            "--target", str(site), "--disable-pip-version-check", "-q", *wheels], check=True)
        else:  # a wheel is a zip of its installed files (purelib/platlib under <name>.data/ if any)
            print("gpu_smoke_wheels: no pip here, extracting the wheels directly")
            for w in wheels:
                with zipfile.ZipFile(w) as z:
                    z.extractall(site)
            for data in site.glob("*.data"):
                for sub in ("purelib", "platlib"):
                    if (data / sub).is_dir():
                        shutil.copytree(data / sub, site, dirs_exist_ok=True)
                shutil.rmtree(data)
    print(f"gpu_smoke_wheels: {len(wheels)} wheels installed into {site}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch and pack the wheels (needs PyPI)")
    d.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                   help="the GPU machine's python version (default: this one's)")
    d.add_argument("--platform", action="append", default=None, help=f"wheel platform tags (default {PLATFORMS})")
    d.add_argument("--bundle", type=Path, default=BUNDLE)
    d.add_argument("--xz-preset", type=int, default=9, help="xz level (9: smallest, slowest)")
    d.add_argument("--skip", default="", help="comma-separated distributions the target has already "
                   "(the H200 image: numpy,pandas,pyarrow); they run at its versions, checked by `check`")
    sub.add_parser("status", help="list the pinned distributions this python lacks")
    sub.add_parser("check", help="every listed distribution present and every requirement among them met")
    i = sub.add_parser("install", help=f"install the bundle into {SITE}")
    i.add_argument("--bundle", type=Path, default=BUNDLE)
    i.add_argument("--site", type=Path, default=SITE)
    o = ap.parse_args(argv)
    if o.cmd == "download":
        download(o.python, o.platform or PLATFORMS, o.bundle, o.xz_preset, tuple(x for x in o.skip.split(",") if x))
    elif o.cmd == "status":
        missing = status()
        print("\n".join(missing) if missing else "all present")
        return 1 if missing else 0
    elif o.cmd == "check":
        problems, kept = check()
        for k in kept:
            print(f"kept at this machine's version: {k}")
        for p in problems:
            print(f"PROBLEM: {p}")
        return 1 if problems else 0
    else:
        install(o.bundle, o.site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
