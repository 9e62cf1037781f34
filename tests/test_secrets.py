"""Secrets in episodes are redacted in every export format, on by default; ordinary text is kept.

The corpus holds one line per kind (issue 26, must-hold 3): each secret is placed in an episode's
first user turn and in an observation the chat formats keep, and in a pair's prompt, then exported
in every format (ETO/ShareGPT, chat messages, full records; JSON Lines and a JSON list).
"""

from __future__ import annotations

import json

import pytest
from test_bad_input import make_episode, make_pair

from eto_train.config import EXPORT_FORMATS
from eto_train.export import export_training_data
from eto_train.records import Step
from eto_train.redact import Redactor
from eto_train.store import append_episodes, write_jsonl

JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PEM_BODY = "MIIEowIBAAKCAQEA1b2c3d4e5f6g7h8i9j0kLmNoPqRsTuVwXyZ0123456789abcdefAB\nq8w7e6r5t4y3u2i1o0pAsDfGhJkL"
# kind: (text holding the secret, the secret's pieces that must be gone, text around it that must stay)
CORPUS = {
    "huggingface": ("export HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 && run",
                    ["hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"], ["export HF_TOKEN=", " && run"]),
    "openai": ("client = OpenAI(api_key=sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH)",
               ["sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH"], ["client = OpenAI(api_key="]),
    "anthropic": ("ANTHROPIC_API_KEY: sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_AbCdEfGh-IjKlMn",
                  ["sk-ant-api03", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_AbCdEfGh-IjKlMn"], ["ANTHROPIC_API_KEY: "]),
    "aws": ("[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = "
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", ["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG"],
            ["aws_access_key_id = ", "aws_secret_access_key = "]),
    # issue 37's trials: the secret half of an AWS key pair outside a credentials file, and an Azure
    # connection string's key (one of 88 characters and a shorter one)
    "aws_bare_pair": ("keys: AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY done",
                      ["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "bPxRfiCYEXAMPLEKEY"], ["keys: ", " done"]),
    "aws_iam_json": ('{"AccessKey": {"AccessKeyId": "AKIAI44QH8DHBEXAMPLE", "SecretAccessKey": '
                     '"je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY", "Status": "Active"}}',
                     ["AKIAI44QH8DHBEXAMPLE", "je7MtGbClwBF", "h3yCo8nvbEXAMPLEKEY"], ['"SecretAccessKey": "']),
    "aws_csv": ("User name,Access key ID,Secret access key\nci,AKIAJ7Q2EXAMPLE5RTZA,Xk2PqLr9zT/4mWnB8vYcE+3sHdJfG6aKu1oN0iE7",
                ["AKIAJ7Q2EXAMPLE5RTZA", "Xk2PqLr9zT", "3sHdJfG6aKu1oN0iE7"], ["Secret access key\nci,"]),
    "azure_storage": ("conn = DefaultEndpointsProtocol=https;AccountName=acmestore;AccountKey="
                      "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6QUJDREVGR0g5OTk5OTk5OT"
                      "==;EndpointSuffix=core.windows.net",
                      ["Zm9vYmFyYmF6cXV4MTIz", "g5OTk5OTk5OT", "k5OT=="],
                      ["DefaultEndpointsProtocol=https;AccountName=acmestore;AccountKey=", ";EndpointSuffix=core.windows.net"]),
    "azure_short_key": ("AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol=https;AccountName=dev;AccountKey="
                        "dGVzdGtleXRlc3RrZXl0ZXN0a2V5dGVzdGtleXRlc3RrZXl0ZXN0a2V5dGVzdGtleQ==;EndpointSuffix=core.windows.net",
                        ["dGVzdGtleXRlc3Rr", "dGVzdGtleQ=="], [";EndpointSuffix=core.windows.net"]),
    "github_classic": ("git clone https://ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789@github.com/acme/repo",
                       ["ghp_", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"], ["git clone https://", "@github.com/acme/repo"]),
    "github_fine_grained": ("GITHUB_TOKEN=github_pat_11ABCDEFG0123456789_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEf",
                            ["github_pat_", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEf"], ["GITHUB_TOKEN="]),
    "slack": ("the bot posted with xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx today",
              ["xoxb-", "AbCdEfGhIjKlMnOpQrStUvWx"], ["the bot posted with ", " today"]),
    "slack_env": ("SLACK_BOT_TOKEN=xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
                  ["xoxb-", "AbCdEfGhIjKlMnOpQrStUvWx"], ["SLACK_BOT_TOKEN="]),
    "jwt_bearer": (f"curl -H 'Authorization: Bearer {JWT}' https://api.example.com/v1",
                   ["eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"],
                   ["curl -H 'Authorization: Bearer ", "' https://api.example.com/v1"]),
    "bare_jwt": (f"session cookie {JWT} set", ["eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", "SflKxwRJSMeKKF2Q"],
                 ["session cookie ", " set"]),
    "bearer_opaque": ("Authorization: Bearer 8f14e45fceea167a5a36dedd4bea2543-opaque", ["8f14e45fceea167a5a36"],
                      ["Authorization: Bearer "]),
    "pem": (f"cat id_rsa\n-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n$ ls",
            ["MIIEowIBAAKCAQEA", "q8w7e6r5t4y3u2i1", "PRIVATE KEY"], ["cat id_rsa\n", "\n$ ls"]),
    "pem_cut_short": (f"key: -----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}", ["MIIEowIBAAKCAQEA", "q8w7e6r5t4y3"],
                      ["key: "]),
    "password_assignment": ("DB_PASSWORD=Tr0ub4dor&3 mysql", ["Tr0ub4dor&3"], ["DB_PASSWORD=", " mysql"]),
    "password_quoted": ('login(user="bob", password="correct horse battery")', ["correct horse battery"],
                        ['login(user="bob", password="']),
    "password_yaml": ("db:\n  password: hunter2hunter2\n", ["hunter2hunter2"], ["db:\n  password: "]),
    "password_json": ('{"username": "bob", "password": "p4ss-w0rd!"}', ["p4ss-w0rd!"], ['"password": "']),
    "secret_key_env": ("SECRET_KEY=django-insecure-8x!k2m@q", ["django-insecure-8x!k2m@q"], ["SECRET_KEY="]),
    "basic_auth_url": ("fetch https://admin:s3cretpass@example.com/api", ["s3cretpass"],
                       ["fetch https://admin:", "@example.com/api"]),
    # issue 53: the three kinds that survived every format; made-up values of each provider's shape
    "mailgun_bare": ("sent with key-6efbe015b48151b7e6744bac1a842dce via the API",
                     ["key-6efbe015b48151b7e6744bac1a842dce", "6efbe015b48151b7e6744bac1a842dce"],
                     ["sent with ", " via the API"]),
    "mailgun_env": ("MAILGUN_API_KEY=key-6efbe015b48151b7e6744bac1a842dce",
                    ["6efbe015b48151b7e6744bac1a842dce"], ["MAILGUN_API_KEY="]),
    "gcp_service_account": ('{"type": "service_account", "project_id": "acme-prod", "private_key_id": '
                            '"741ef7b742131fca871cd456ab6f7fb5f693d2cc", "client_email": '
                            '"ci@acme-prod.iam.gserviceaccount.com"}',
                            ["741ef7b742131fca871cd456ab6f7fb5f693d2cc"], ['"private_key_id": "']),
    "sendgrid": ("SENDGRID_API_KEY=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",
                 ["SG.jLqZD6ENEy8_2DwBQrxJ4P", "0mbFkWUHyG8QuxSlhW3c379sZBVgFH1dPcRHkWgeeYe"], ["SENDGRID_API_KEY="]),
    "sendgrid_one_short": ("mail via SG.QEVHixHgzXAQZa6XLdAI6A.nGOIZdzqsmiWIytnEhNEoSAZcGQ5UysinzOtDw0SVp then",
                           ["SG.QEVHixHgzXAQZa6XLdAI6A", "QEVHixHgzXAQZa6XLdAI6A", "nGOIZdzqsmiWIytnEhNEoSAZcGQ5Uysin"],
                           ["mail via ", " then"]),
    "high_entropy": ("the cookie was Zx9Qw2Lp7Rt4Ys1Vb8Nm3Kd6Hg5Jf0Ac", ["Zx9Qw2Lp7Rt4Ys1Vb8Nm3Kd6Hg5Jf0Ac"],
                     ["the cookie was "]),
}

# Ordinary agent and project text of the four environments: must come out unchanged
ORDINARY = [
    "You are in the living room. In one part of the room you see a block of cheese. There is also a box, "
    "that is empty. \nTo the North you see the parlor.",
    "The map reads:\n  The parlor connects to the living room and chamber.",
    "Task: task-2a-test-conductivity-of-unknown-substances_456 Your task is to determine if unknown substance B "
    "is electrically conductive.",
    "json_2.1.1/valid_seen/pick_and_place_simple-Mug-None-Shelf-214/trial_T20190908_052232_887934/game.tw-pddl",
    "Action: click[b07pgl2zsl]\nObservation: [SEP] Back to Search [SEP] B07PGL2ZSL [SEP] $24.99 [SEP] size: small",
    "policy bc@103fa2aa08cd weights 103fa2aa08cd6a8d22bfdc6ab4492b51cd267a53f8ed4b3a18367d2cb7ebac45",
    "Think: the password is somewhere in the study; I should read the note.\nAction: open the drawer",
    "the token is on the table; take token",
    "The secret: coins are here. The bearer responsibilities are many.",
]


def _episode(i: int, text: str):
    ep = make_episode(i)
    ep.first_user = f"Task: go\nObservation: {text}"
    ep.first_observation = text
    ep.steps[0].observation = f"tool output: {text}"
    ep.steps[0].done = False
    ep.steps.append(Step(index=1, raw_output="Action: go", action="go", valid=True, observation="end",
                         reward=1.0, done=True))
    return ep


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for x in obj:
            yield from _strings(x)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)


def _exported_text(out) -> str:
    """Every string of an export: a file (JSON list or JSON Lines) or the eto_eval folder's files."""
    files = sorted(f for f in out.rglob("*") if f.is_file()) if out.is_dir() else [out]
    rows = []
    for f in files:
        rows += [json.loads(f.read_text())] if f.suffix == ".json" else [json.loads(x) for x in f.read_text().splitlines()]
    return "\n".join(_strings(rows))


def _output(tmp_path, fmt, suffix=".jsonl"):
    return tmp_path / "export" / "outputs" / "policy" if fmt == "eto_eval" else tmp_path / f"export{suffix}"


# every format of each source (eto_eval, the authors' evaluation outputs, holds episodes only)
CASES = [(src, fmt, suf) for src in ("episodes", "pairs") for fmt in EXPORT_FORMATS for suf in (".jsonl", ".json")
         if not (fmt == "eto_eval" and (src == "pairs" or suf == ".json"))
         and not (fmt == "agenttraj" and src == "pairs")]  # both layouts hold trajectories only: pairs are refused


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    d = tmp_path_factory.mktemp("leaky")
    episodes, pairs = d / "episodes.jsonl", d / "pairs.jsonl"
    append_episodes(episodes, [_episode(i, text) for i, (text, _, _) in enumerate(CORPUS.values())])
    write_jsonl(pairs, [make_pair(pair_id=f"p{i}", task_id=f"g/train/{i}",
                                  prompt=[{"role": "system", "content": "Act."}, {"role": "user", "content": text}])
                        for i, (text, _, _) in enumerate(CORPUS.values())])
    return episodes, pairs


@pytest.mark.parametrize("source, fmt, suffix", CASES)
def test_every_secret_of_the_corpus_is_redacted_in_every_format(tmp_path, leaky, fmt, suffix, source):
    src = leaky[0] if source == "episodes" else leaky[1]
    raw = src.read_bytes()
    out = _output(tmp_path, fmt, suffix)
    report = export_training_data([src], out, {"format": fmt})  # the defaults: no user patterns
    text = _exported_text(out)
    for kind, (_, gone, kept) in CORPUS.items():
        for piece in gone:
            assert piece not in text, f"{kind}: {piece!r} leaked in format {fmt}"
        for piece in kept:
            assert piece in text, f"{kind}: the text around the secret, {piece!r}, was lost in format {fmt}"
    assert report["redactions"] == {} and sum(report["secrets_redacted"].values()) >= len(CORPUS)
    assert {"Hugging Face token", "Anthropic API key", "AWS Access Key", "Slack Token", "Authorization header",
            "private key (PEM block)", "password assignment"} <= set(report["secrets_redacted"])
    assert src.read_bytes() == raw


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_ordinary_episode_text_is_exported_unchanged(tmp_path, fmt):
    store = tmp_path / "episodes.jsonl"
    append_episodes(store, [_episode(i, text) for i, text in enumerate(ORDINARY)])
    on, off = _output(tmp_path / "on", fmt), _output(tmp_path / "off", fmt)
    report = export_training_data([store], on, {"format": fmt})
    export_training_data([store], off, {"format": fmt, "detect_secrets": False})
    assert _exported_text(on) == _exported_text(off) and report["secrets_redacted"] == {}
    assert all(t in _exported_text(on) for t in ORDINARY)


def test_detection_can_be_turned_off_and_user_patterns_stay_on_top(tmp_path, leaky):
    out = tmp_path / "off.jsonl"
    report = export_training_data([leaky[0]], out, {"format": "episodes", "detect_secrets": False,
                                                     "redact_patterns": [r"hf_(?P<secret>\w+)"]})
    text = out.read_text()
    assert "hf_[REDACTED]" in text and "AKIAIOSFODNN7EXAMPLE" in text  # only the user's pattern ran
    assert report["secrets_redacted"] == {} and report["redactions"] == {r"hf_(?P<secret>\w+)": 3}


def test_redactor_keeps_the_text_around_a_secret_and_counts_by_kind():
    with Redactor() as r:
        assert r.text("token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789, ok") == "token [REDACTED], ok"
        assert r.text("x = 'AKIAIOSFODNN7EXAMPLE'") == "x = '[REDACTED]'"
        assert r(["a", {"k": "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx"}]) == ["a", {"k": "[REDACTED]"}]
    assert r.counts == {"Hugging Face token": 1, "AWS Access Key": 1, "Anthropic API key": 1}


@pytest.mark.parametrize("cfg, message", [
    ({"detect_secrets": "yes"}, r"export.detect_secrets: 'yes' is not true or false"),
    ({"entropy_limit": 9}, r"export.entropy_limit: 9 is not null or a number in \(0, 8\]"),
])
def test_bad_secret_options_are_clear_errors(tmp_path, leaky, cfg, message):
    with pytest.raises(ValueError, match=message):
        export_training_data([leaky[0]], tmp_path / "x.jsonl", cfg)
    assert not (tmp_path / "x.jsonl").exists()
