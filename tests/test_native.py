"""The project's C++ kernels' builder (eto_train.native): one build per source, CPU, flags and torch install; a build that
fails falls back once, said; runtime.cpu_kernels=false builds nothing; each kernel is the default only on a CPU whose
instructions its vector path needs (AVX-512), torch's kernel elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eto_train import native
from eto_train.native import attention_kernel, decode_kernel


def test_the_build_name_changes_with_the_source_the_flags_the_torch_install_and_the_cpu(monkeypatch):
    """-march=native builds for this CPU: another CPU (or source, flags, torch install: another venv) must not
    reuse the build."""
    src = decode_kernel.SOURCE
    first = native.name(src)
    assert first.startswith("eto_decode_attention_") and first == native.name(src)
    assert native.name(attention_kernel.SOURCE).startswith("eto_causal_attention_")
    monkeypatch.setattr(native, "_cpu", lambda: "model name: another CPU\nflags: sse2")
    assert native.name(src) != first
    monkeypatch.undo()
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-DX"])
    assert native.name(src) != first
    monkeypatch.undo()
    monkeypatch.setattr(native, "HEADER", decode_kernel.SOURCE)  # another header's text
    assert native.name(src) != first
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__file__", "/another/venv/torch/__init__.py")
    assert native.name(src) != first


def test_another_checkout_of_the_same_source_builds_apart(tmp_path):
    """A pinned worktree beside the main checkout shares the venv and the extension folder: the same source text at
    another path gets its own build (ninja would otherwise rebuild each one's kernel whenever the other loads it)."""
    other = tmp_path / decode_kernel.SOURCE.name
    other.write_text(decode_kernel.SOURCE.read_text())
    assert native.name(other) != native.name(decode_kernel.SOURCE)
    assert native.name(other).startswith("eto_decode_attention_")


def test_a_build_lock_left_by_a_killed_build_does_not_block_the_next(monkeypatch, tmp_path, capsys):
    """torch's builder marks a build with a file only it removes; a builder killed while holding it used to make every
    later load wait forever (a ScienceWorld play hung on one left by a killed test run). load() builds under an OS
    lock that dies with its holder, removes such a leftover, says so, and builds in the folder it names."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_built", {})
    directory = native.build_directory(decode_kernel.SOURCE)
    assert directory == tmp_path / native.name(decode_kernel.SOURCE)
    directory.mkdir()
    (directory / "lock").touch()  # what a killed builder leaves
    calls, extension = [], object()  # a str would read as a failure's reason

    def build(name, sources, **kw):
        calls.append((name, kw["build_directory"], (Path(kw["build_directory"]) / "lock").exists()))
        return extension

    monkeypatch.setattr(ext, "load", build)
    assert decode_kernel.load() is extension and decode_kernel.load() is extension
    assert calls == [(directory.name, str(directory), False)]  # built once, in its folder, no baton left in it
    assert f"note: removed {directory / 'lock'}" in capsys.readouterr().out


def test_one_builder_at_a_time_across_processes(tmp_path, capsys):
    """The OS lock excludes another process while held, waits (said) rather than fails, and is free again once its
    holder is killed with SIGKILL inside the build (no code of its own runs to release it)."""
    import subprocess
    import sys
    import textwrap

    directory = tmp_path / "eto_x"
    probe = (f"import fcntl; f = open({str(tmp_path / 'eto_x.flock')!r}, 'a')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')")

    def probed() -> str:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    with native._one_builder(directory):
        assert probed() == "held"
    assert probed() == "free"
    killed = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from eto_train import native
        with native._one_builder(Path({str(directory)!r})):
            (Path({str(directory)!r}) / "lock").touch()  # torch's baton, as a builder killed mid-build leaves it
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    assert subprocess.run([sys.executable, "-c", killed]).returncode == -9
    assert probed() == "free" and (directory / "lock").exists()
    with native._one_builder(directory):  # the next builder: no wait, the baton removed
        assert not (directory / "lock").exists()
    assert "removed" in capsys.readouterr().out


def test_a_file_system_without_flock_builds_without_the_lock(monkeypatch, tmp_path, capsys):
    import fcntl

    def refuse(*a):
        raise OSError(37, "No locks available")
    monkeypatch.setattr(fcntl, "flock", refuse)
    ran = []
    with native._one_builder(tmp_path / "eto_y"):
        ran.append(True)
    assert ran == [True] and "no build lock" in capsys.readouterr().out


def test_a_kernel_that_cannot_be_built_falls_back_with_one_warning(monkeypatch, capsys, tiny_model_dir):
    """No compiler (the build raises): load() says why and what it does instead, once per source, and returns None
    every time after without building again; a KV session then decodes with torch's kernel (cache.kernel None)."""
    import torch.utils.cpp_extension as ext

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.kvbatch import KVBatch

    tries = []
    monkeypatch.setattr(native, "_built", {})

    def broken(*a, **kw):
        tries.append(a[0])
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(ext, "load", broken)
    assert decode_kernel.load() is None and decode_kernel.load() is None and len(tries) == 1
    assert attention_kernel.load() is None and len(tries) == 2  # the other source tries once too
    out = capsys.readouterr().out
    assert out.count("warning: the C++ kernel decode_attention.cpp could not be built") == 1
    assert out.count("warning: the C++ kernel causal_attention.cpp could not be built") == 1
    assert "Ninja is required" in out and "decode steps use torch's flash kernel" in out
    assert "runtime.cpu_kernels=false skips the build" in out
    session = KVBatch(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), 4, 256)
    assert session.cache.kernel is None and len(tries) == 2
    off = KVBatch(session.model, session.tok, 4, 256, decode_kernel=False)  # never builds
    assert off.cache.kernel is None and len(tries) == 2


def test_runtime_cpu_kernels_false_builds_nothing(monkeypatch, tiny_model_dir):
    """runtime.cpu_kernels: false, read once (runtime.configure, the entry point's): nothing is built or used; the
    shipped config has them on, and refuses a value that is not a flag."""
    from pathlib import Path

    import torch.utils.cpp_extension as ext
    from hydra import compose, initialize_config_dir

    from eto_train import runtime
    from eto_train.config import ConfigError, load
    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.kvbatch import KVBatch

    root = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(str(root), version_base="1.3"):
        assert load(compose("config")).runtime.cpu_kernels is True
        off = load(compose("config", overrides=["runtime.cpu_kernels=false"])).runtime
        bad = compose("config", overrides=["runtime.cpu_kernels=sometimes"])
    with pytest.raises(ConfigError, match=r"runtime.cpu_kernels"):
        load(bad)
    monkeypatch.setattr(native, "_built", {})
    monkeypatch.setattr(ext, "load", lambda *a, **kw: pytest.fail("a kernel was built with cpu_kernels off"))
    monkeypatch.setattr(runtime, "_library_hooks", runtime._library_hooks)
    try:
        runtime.configure(off)
        assert not native.enabled() and decode_kernel.load() is None and attention_kernel.load() is None
        session = KVBatch(load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), 4, 256)
        assert session.cache.kernel is None
    finally:
        native.enable(True)


def test_the_runtime_switches_are_read_in_one_place():
    """runtime.cpu_kernels and runtime.library_hooks are read once per process, by runtime.configure, which the
    entry point calls where the config is typed; no stage passes them on (setup_runtime takes the threads only)."""
    import ast
    import inspect
    from pathlib import Path

    from eto_train import cli, runtime

    src = Path(native.__file__).resolve().parents[1]
    readers = sorted(str(f.relative_to(src)) for f in src.rglob("*.py")
                     if any(isinstance(n, ast.Attribute) and n.attr in ("cpu_kernels", "library_hooks")
                            and isinstance(n.value, ast.Attribute) and n.value.attr == "runtime"
                            for n in ast.walk(ast.parse(f.read_text()))))
    assert readers == []  # no cfg.runtime.cpu_kernels / .library_hooks anywhere: configure(section) reads them
    assert list(inspect.signature(runtime.setup_runtime).parameters) == ["threads"]
    assert "runtime.configure(config.runtime)" in inspect.getsource(cli._job)


def test_a_builder_that_cannot_be_imported_falls_back_too(monkeypatch, capsys):
    """A bare venv whose setuptools lacks a dependency (torch's builder imports it; the GPU smoke test's venv
    did): the same single warning and torch's kernels, not a crash of the stage."""
    import sys

    monkeypatch.setattr(native, "_built", {})
    monkeypatch.setitem(sys.modules, "torch.utils.cpp_extension", None)  # its import raises ImportError
    assert decode_kernel.load() is None and decode_kernel.load() is None
    assert capsys.readouterr().out.count("warning: the C++ kernel decode_attention.cpp could not be built") == 1


# CPU flags as /proc/cpuinfo gives them: this box's AMD EPYC Zen 3 (AVX2 only), an AVX-512 one without bf16 dot
# products (Intel Skylake-X) and the Zen 4 the kernels were measured on (avx512f, avx512_bf16)
AVX2 = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx f16c avx2 bmi1 bmi2 adx sha_ni".split())
AVX512 = AVX2 | {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}
AVX512_BF16 = AVX512 | {"avx512_bf16", "avx512_vnni", "avx512vbmi"}


def as_cpu(monkeypatch, flags) -> None:
    """This process as on a CPU with ``flags``, choosing per CPU (not forced, as conftest.py has it)."""
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(native, "_faster", {})
    monkeypatch.setattr(native, "_forced", [False])


def test_a_kernel_is_the_default_only_where_the_build_targets_its_vector_path():
    """The decode kernel needs avx512f, bf16 training's also avx512_bf16 (its bf16 matmuls); -march=native targets
    the CPU's flags, -mno-avx512f none of AVX-512's (the AVX2 path on any machine), another -march none."""
    dec, att = decode_kernel.SOURCE, attention_kernel.SOURCE
    assert not native.faster(dec, AVX2) and not native.faster(att, AVX2)
    assert native.faster(dec, AVX512) and not native.faster(att, AVX512)
    assert native.faster(dec, AVX512_BF16) and native.faster(att, AVX512_BF16)
    no512 = [*native.CFLAGS, "-mno-avx512f"]
    assert not native.faster(dec, AVX512_BF16, no512) and not native.faster(att, AVX512_BF16, no512)
    assert native.faster(dec, AVX512_BF16, [*native.CFLAGS, "-mno-avx512bf16"])
    assert not native.faster(att, AVX512_BF16, [*native.CFLAGS, "-mno-avx512bf16"])
    assert not native.faster(dec, AVX512_BF16, ["-O3", "-march=x86-64-v3"])
    assert native.target(AVX512_BF16, no512) == {f.replace("_", "") for f in AVX2}
    assert native.faster(dec, native.cpu_flags()) == ("avx512f" in native.cpu_flags())  # this machine's


def test_the_default_uses_torchs_kernels_on_avx2_the_cpp_ones_on_avx512_and_never_when_off(monkeypatch,
                                                                                            tiny_model_dir):
    """Through load(), as the engine and the trainers ask: on AVX2 flags nothing is built and the KV engine's
    session decodes with torch's kernel; on AVX-512 flags each kernel whose needs the CPU has is built and used;
    runtime.cpu_kernels=false never; the stage manifests' versions say which ran."""
    import torch.utils.cpp_extension as ext

    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.rollouts.kvbatch import KVBatch
    from eto_train.runtime import versions

    built = []
    monkeypatch.setattr(native, "_built", {})
    monkeypatch.setattr(ext, "load", lambda name, *a, **kw: built.append(name) or object())
    as_cpu(monkeypatch, AVX2)
    assert decode_kernel.load() is None and attention_kernel.load() is None and not built
    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    assert KVBatch(model, tok, 4, 256).cache.kernel is None and not built
    assert versions()["cpu_kernels"] == ("decode_attention: torch's (the build targets no avx512f); causal_attention: "
                                         "torch's (the build targets no avx512f, avx512_bf16)")
    as_cpu(monkeypatch, AVX512)
    assert decode_kernel.load() is not None and attention_kernel.load() is None and len(built) == 1
    assert KVBatch(model, tok, 4, 256).cache.kernel is decode_kernel.load() and len(built) == 1
    assert "causal_attention: torch's (the build targets no avx512_bf16)" in native.choices()
    as_cpu(monkeypatch, AVX512_BF16)
    assert attention_kernel.load() is not None and len(built) == 2
    assert native.choices() == "decode_attention: C++; causal_attention: C++"
    native.enable(False)
    try:
        assert decode_kernel.load() is None and attention_kernel.load() is None
        assert KVBatch(model, tok, 4, 256).cache.kernel is None
        assert versions()["cpu_kernels"].count("torch's (runtime.cpu_kernels=false)") == 2
    finally:
        native.enable(True)
    as_cpu(monkeypatch, AVX2)
    native.force(True)  # the bench's side by side: the C++ kernel on any CPU
    assert decode_kernel.load() is not None and "C++ (forced)" in native.choices()
