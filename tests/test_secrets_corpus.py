"""Redaction's coverage counted on a public corpus of fake secrets (issue 53).

The corpus (``tests/data/secrets/credsweeper``, source, commit and license in ``tests/data/secrets/NOTICE.md``):
92 sample files of Samsung's CredSweeper test data, one or a few made-up keys of one provider each, and the
186 findings that CredSweeper's own expected output (``tests/data/output.json`` there) lists in them, of 101
kinds (its generic password/token/key rules, PEM bodies and JWK structure left out). Neither rule set that
redact.py uses was written against it. Each file is redacted as one string (an observation holding it), and a
finding counts as redacted when no piece of it survives on its line (:func:`leaked`).

``python tests/test_secrets_corpus.py`` prints the per-kind table of docs/lab/durability_log.md.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from eto_train.redact import Redactor

CORPUS = Path(__file__).parent / "data" / "secrets" / "credsweeper"

# measured with detect-secrets 1.5.0 + kingfisher-secret-scanner 1.5.0 + the named patterns (issue 53);
# on the code before it (detect-secrets and the named patterns alone): 121 of 186, 58 of 101 kinds
FLOOR_FINDINGS = 148
FLOOR_KINDS = 78


def leaked(value: str, text: str) -> bool:
    """Whether a piece of ``value`` survives in ``text``: any 8 characters of it in a row (4 to 8 for a
    value under 16: half of it), so a kept ``SG.<22>.`` id or a kept tail counts as a leak."""
    k = min(8, max(4, len(value) // 2))
    return any(value[i:i + k] in text for i in range(len(value) - k + 1))


def coverage() -> tuple[dict[str, list[int]], list[dict], float]:
    """Per kind [redacted, total], the findings that leaked, and the seconds the redaction took."""
    rows = json.loads((CORPUS / "expected.json").read_text())
    raw = {f: (CORPUS / "samples" / f).read_text(encoding="utf-8") for f in sorted({row["file"] for row in rows})}
    t0 = time.perf_counter()
    with Redactor() as r:
        out = {f: r.text(text) for f, text in raw.items()}
    seconds = time.perf_counter() - t0
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    missed = []
    for row in rows:
        lines = out[row["file"]].splitlines()
        # the line it was on; the whole file where a secret replaced with its newlines moved the lines
        same = len(lines) == len(raw[row["file"]].splitlines())
        text = lines[row["line"] - 1] if same else out[row["file"]]
        kinds[row["rule"]][1] += 1
        if leaked(row["value"], text):
            missed.append(row)
        else:
            kinds[row["rule"]][0] += 1
    return dict(kinds), missed, seconds


def test_the_corpus_is_what_its_notice_says():
    rows = json.loads((CORPUS / "expected.json").read_text())
    files = {p.name for p in (CORPUS / "samples").iterdir()}
    assert len(rows) == 186 and {row["file"] for row in rows} == files and len(files) == 92
    assert len({row["rule"] for row in rows}) == 101
    for row in rows:  # every finding is on the line its row names
        assert row["value"] in (CORPUS / "samples" / row["file"]).read_text(encoding="utf-8").splitlines()[row["line"] - 1]


def test_coverage_on_the_public_corpus_holds_its_measured_floor():
    kinds, missed, _ = coverage()
    found = sum(k[0] for k in kinds.values())
    whole = sum(1 for k in kinds.values() if k[0] == k[1])
    assert found >= FLOOR_FINDINGS, f"{found} of 186 redacted; leaked: {[(m['rule'], m['value']) for m in missed]}"
    assert whole >= FLOOR_KINDS, f"{whole} of {len(kinds)} kinds redacted whole"
    # the corpus's Mailgun key (bare, no keyword), SendGrid key (16 + 16) and the kinds issue 53 names
    for kind in ("MailGun API Key", "SendGrid API Key", "Github Classic Token", "Slack Token", "OpenAI Token"):
        assert kinds[kind][0] >= 1, kind


@pytest.mark.parametrize("text, expected", [
    # Mailgun: key- and 32 hex, bare and in an assignment
    ("curl -u api:key-6efbe015b48151b7e6744bac1a842dce https://api.mailgun.net/v3",
     "curl -u api:[REDACTED] https://api.mailgun.net/v3"),
    ("MAILGUN_KEY = 'key-6efbe015b48151b7e6744bac1a842dce'", "MAILGUN_KEY = '[REDACTED]'"),
    # a GCP service-account key file's key id (its private key is a PEM block, redacted before)
    ('{"type": "service_account", "private_key_id": "741ef7b742131fca871cd456ab6f7fb5f693d2cc", "x": 1}',
     '{"type": "service_account", "private_key_id": "[REDACTED]", "x": 1}'),
    ("private_key_id: 741ef7b742131fca871cd456ab6f7fb5f693d2cc", "private_key_id: [REDACTED]"),
    # SendGrid: SG.<22>.<43>, and one character short (its SG.<22>. id was kept)
    ("key 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 ok", "key [REDACTED] ok"),
    ("key SG.QEVHixHgzXAQZa6XLdAI6A.nGOIZdzqsmiWIytnEhNEoSAZcGQ5UysinzOtDw0SVp ok", "key [REDACTED] ok"),
])
def test_the_three_kinds_of_issue_53_are_redacted_whole(text, expected):
    with Redactor() as r:
        assert r.text(text) == expected


def test_kingfisher_findings_are_counted_under_their_rule():
    with Redactor() as r:  # Databricks: no plugin of detect-secrets, a Betterleaks rule
        assert r.text("token dapi0123456789abcdef0123456789abcdef done") == "token [REDACTED] done"
    assert r.counts == {"betterleaks.databricks-api-token": 1}


if __name__ == "__main__":  # the table of docs/lab/durability_log.md
    kinds, missed, seconds = coverage()
    found, total = sum(k[0] for k in kinds.values()), sum(k[1] for k in kinds.values())
    whole = sorted(k for k, v in kinds.items() if v[0] == v[1])
    print(f"{found} of {total} findings redacted ({100 * found / total:.1f}%), {len(whole)} of {len(kinds)} kinds whole, "
          f"{seconds:.2f} s")
    for kind, (a, b) in sorted(kinds.items()):
        print(f"{kind}\t{a}/{b}")
    for m in missed:
        print("leaked:", m["file"], m["rule"], m["value"][:60])
