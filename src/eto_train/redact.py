"""Secret redaction for the training export: two maintained rule sets (Yelp's detect-secrets and
Kingfisher's bundled catalog) plus the project's named patterns.

The raw episode store may hold secrets that a tool output or an environment printed (a token in
an observation, a key in a shell transcript); nothing that trains on an export should see them.
:class:`Redactor` replaces just the secret in every string and keeps the text around it, and
counts what it replaced by kind. Four layers, in this order:

1. ``export.redact_patterns``, the user's own regexes (each whole match, or its ``(?P<secret>...)``
   group when it has one, becomes the replacement; counted by pattern);
2. :data:`PATTERNS`, the project's named patterns for what detect-secrets 1.5.0 has no plugin
   for, or finds only in part (below);
3. detect-secrets' own plugins (:data:`PLUGINS`), run line by line through its ad-hoc
   line-scanning API (``detect_secrets.core.scan.scan_line``, core/scan.py:109), which also
   applies the library's false-positive filters (templated values, ``${VAR}``, uuids, sequences);
4. Kingfisher's bundled rule catalog (MongoDB's ``kingfisher-secret-scanner`` 1.5.0, import
   ``kingfisher_sdk``: 462 Betterleaks rules, the gitleaks successor's, and 26 of Google's Veles
   (OSV-SCALIBR) rules, compiled in the wheel; scanning never uses the network), run on the whole
   string after detect-secrets' named plugins and before its high-entropy detector, so that a
   provider's key is counted under its kind and not as entropy: Mailgun, Atlassian, Databricks,
   DigitalOcean, Dynatrace, New Relic, Postman, Sentry, Shopify, SonarQube, ... (issue 53).

Where detect-secrets 1.5.0 falls short (read from its plugins in site-packages/detect_secrets/plugins):
no Hugging Face, Anthropic or GitHub fine-grained (``github_pat_``) plugin; ``OpenAIDetector``
knows only keys that contain ``T3BlbkFJ``; ``AWSKeyDetector`` and ``KeywordDetector`` want the
value in quotes; ``GitHubTokenDetector`` reports only the prefix (``ghp``) and ``JwtTokenDetector``
the token without its signature (both are widened to the whole token, :func:`_widen`);
``SendGridDetector`` wants a tail of exactly 43 characters (a key one character short kept its
``SG.<22>.`` id: only the entropy detector took the tail); no Mailgun plugin;
``PrivateKeyDetector`` reports the ``BEGIN ... PRIVATE KEY`` line, not the key. The high-entropy
plugins in ad-hoc scans report every word and leave the limit to the caller
(plugins/high_entropy_strings.py:56-76): the limit is applied here, to base64 strings only
(the hex detector would take every sha256 and policy id the project itself writes).

Where Kingfisher 1.5.0's catalog falls short too (issue 53): its Mailgun rules want the word
``mailgun`` before the key (a bare ``key-`` + 32 hex survived), its SendGrid rules exact lengths,
and its GCP service-account rule the whole key file (a ``"private_key_id"`` line survived): the
three named patterns below cover them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

# an AWS secret access key: 40 characters of base64 with both cases (a sha1 in hex has no capitals)
_AWS_SECRET = r"(?P<secret>(?=[A-Za-z0-9/+]{0,39}[a-z])(?=[A-Za-z0-9/+]{0,39}[A-Z])[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"

# The project's named patterns; a ``secret`` group, when present, is all that is replaced.
PATTERNS: dict[str, str] = {
    "private key (PEM block)":  # the whole block, or to the end of the text when it was cut
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    "Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "Anthropic API key": r"\bsk-ant-[A-Za-z0-9_-]{20,}",
    "OpenAI-style API key": r"\bsk-(?!ant-)[A-Za-z0-9_-]{20,}",
    "GitHub fine-grained token": r"\bgithub_pat_[A-Za-z0-9_]{30,}",
    "GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{30,}",
    "Authorization header": r"(?i)\b(?:authorization|proxy-authorization)\s*[:=]\s*[\"']?"
                            r"(?:bearer|basic|token|digest)\s+(?P<secret>[A-Za-z0-9\-._~+/]{8,}=*)",
    "bearer token": r"(?i)\bbearer\s+(?=[A-Za-z\-._~+/]*[0-9])(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)",  # a digit:
    # not "the bearer responsibilities"
    "AWS secret access key": r"(?i)\baws[A-Za-z0-9_.-]{0,20}?(?:secret|key)[A-Za-z0-9_.-]{0,20}\s*[:=]\s*[\"']?"
                             r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
    # its other names (``"SecretAccessKey": ...`` of `aws iam create-access-key`, ``secret_access_key:``,
    # a credentials CSV's ``Secret access key`` column), and a bare 40-character secret written beside
    # its key id (``AKIA...`` within 300 characters, either side): mixed case, so never a sha1 in hex
    "AWS secret access key (named)": r"(?i)\bsecret[ _-]?access[ _-]?key[\"']?\s*[:=,]\s*[\"']?"
                                     r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
    "AWS secret access key (beside its key id)":
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b[\s\S]{0,300}?(?<![A-Za-z0-9/+=])" + _AWS_SECRET,
    "AWS secret access key (before its key id)":
        r"(?<![A-Za-z0-9/+=])" + _AWS_SECRET + r"[\s\S]{0,300}?\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
    # an Azure connection string's key (storage ``AccountKey=``, Service Bus / Event Hubs ``SharedAccessKey=``,
    # a SAS ``SharedAccessSignature=``), whatever its length: detect-secrets' AzureStorageKeyDetector takes
    # exactly 88 characters after ``AccountKey=`` (a shorter or padded key survived, or its padding did)
    "Azure connection string key": r"(?i)\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)\s*=\s*"
                                   r"(?P<secret>[^;\s\"']{8,})",
    # issue 53: kinds that both rule sets miss or find only in part (see the module doc)
    "Mailgun API key": r"\b(?:pub)?key-[0-9a-f]{32}\b",  # Mailgun's private and public keys, bare
    "SendGrid API key": r"\bSG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64}",  # id and tail, any close length
    "GCP service-account key id": r"(?i)[\"']?private_key_id[\"']?\s*[:=]\s*[\"']?(?P<secret>[0-9a-f]{40})\b",
    # ``password = ...``, ``DB_PASSWORD: ...``, ``api_key=...``; the weak words (secret, token, pwd) only
    # inside a name (SECRET_KEY, session_token, db_pwd), not "The secret: ..." of a game's text
    "password assignment": r"(?i)(?<![A-Za-z0-9])(?:[A-Za-z0-9_.-]*(?:password|passwd|passphrase|api[_-]?key"
                           r"|access[_-]?token|auth[_-]?token|client[_-]?secret)[A-Za-z0-9_.-]*"
                           r"|[A-Za-z0-9]+[_.-](?:secret|token|pwd)[A-Za-z0-9_.-]*|(?:secret|token|pwd)[_.-][A-Za-z0-9_.-]+)"
                           r"[\"']?\s*[:=]\s*(?P<q>[\"']?)(?P<secret>[^\s\"']{4,})(?P=q)",
}

# detect-secrets plugins used (class names, plugins/*.py). Left out: HexHighEntropyString (every
# sha256, seed and policy id), IPPublicDetector (an address is not a credential).
PLUGINS: tuple[str, ...] = (
    "ArtifactoryDetector", "AWSKeyDetector", "AzureStorageKeyDetector", "BasicAuthDetector",
    "CloudantDetector", "DiscordBotTokenDetector", "GitHubTokenDetector", "GitLabTokenDetector",
    "IbmCloudIamDetector", "IbmCosHmacDetector", "JwtTokenDetector", "KeywordDetector",
    "MailchimpDetector", "NpmDetector", "OpenAIDetector", "PrivateKeyDetector", "PypiTokenDetector",
    "SendGridDetector", "SlackDetector", "SoftlayerDetector", "SquareOAuthDetector", "StripeDetector",
    "TelegramBotTokenDetector", "TwilioKeyDetector", "Base64HighEntropyString",
)
ENTROPY = "Base64 High Entropy String"
_TOKEN = re.compile(r"[A-Za-z0-9_\-]")  # a token's characters: a partly reported secret is widened over them
_MIN_ENTROPY_LEN = 20  # a high-entropy finding shorter than this is a word, not a key
_WORDISH = re.compile(r"[A-Za-z][a-z]*|[0-9]+|[A-Z]+|[A-Za-z][0-9]{1,3}")  # a word, a number, an acronym, T2
_ASSIGNED = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*=(?=.)")


def _entropy_candidates(value: str) -> list[str]:
    """The parts of a base64-like run that may be a random secret: ``NAME=value`` gives the value
    (``=`` is a base64 character), a path its segments (``/`` is one too: ALFWorld's game paths,
    file paths in tool output), each of 20 characters or more and not an identifier made of
    words and numbers (``pick_and_place_simple-Mug-None-Shelf-214``, a ScienceWorld task name)."""
    value = _ASSIGNED.sub("", value)
    return [seg for seg in value.split("/") if len(seg) >= _MIN_ENTROPY_LEN
            and not all(_WORDISH.fullmatch(part) for part in re.split(r"[_\-.=+]+", seg) if part)]


def _widen(line: str, start: int, end: int) -> tuple[int, int]:
    """The span of the whole token around ``line[start:end]`` (a plugin that reports ``ghp`` of
    ``ghp_...``, or a JWT without its signature)."""
    while start > 0 and _TOKEN.match(line[start - 1]):
        start -= 1
    while end < len(line) and (_TOKEN.match(line[end]) or (line[end] == "." and end + 1 < len(line)
                                                          and _TOKEN.match(line[end + 1]))):
        end += 1
    return start, end


@lru_cache(maxsize=1)
def _kingfisher() -> Any:
    """Kingfisher's scanner over its bundled catalog, compiled once a process. Vectorscan keeps the
    compiled rules in the user's cache folder (``KF_RULE_CACHE_DIR``, else the OS's: about 6 s the
    first time on the 2-core box, 0.6 s after); Base64 decoding is off (a base64 run is the entropy
    detector's, and a decoded finding has no span in the text)."""
    try:
        from kingfisher_sdk import Rules, Scanner
    except ImportError as exc:  # a dependency of the package (pyproject.toml)
        raise ImportError("export.detect_secrets=true needs kingfisher-secret-scanner (pip install -c "
                          "constraints.txt -e .), or set export.detect_secrets=false") from exc
    return Scanner(Rules(), base64=False)


@lru_cache(maxsize=16384)  # episodes repeat their instructions and observations
def _kingfisher_scan(text: str) -> tuple[tuple[str, str], ...]:
    """(rule id, secret) of each finding Kingfisher reports in ``text`` (its helper findings, parts of
    a multi-part credential it does not report alone, are left out)."""
    return tuple((f.rule_id, f.secret) for f in _kingfisher().scan(text) if f.visible and f.secret)


def _replace_spans(text: str, spans: list[tuple[int, int, str]], replacement: str,
                   counts: dict[str, int]) -> str:
    """Replace the (start, end, kind) spans of ``text`` (overlaps merged, counted once by the first)."""
    out, pos = [], 0
    for start, end, kind in sorted(spans):
        if end <= pos:
            continue
        start = max(start, pos)
        out.append(text[pos:start])
        out.append(replacement)
        counts[kind] = counts.get(kind, 0) + 1
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _pattern_spans(pattern: re.Pattern, text: str, kind: str) -> list[tuple[int, int, str]]:
    group = "secret" if "secret" in pattern.groupindex else 0
    return [(m.start(group), m.end(group), kind) for m in pattern.finditer(text) if m.end(group) > m.start(group)]


class Redactor:
    """Replaces secrets in strings; ``counts`` holds how many of each kind were replaced.

    ``user_patterns`` are counted under their pattern text; the project's and the library's
    findings under their kind's name. ``detect=False`` leaves only the user's patterns.
    ``entropy_limit``: the Shannon entropy (bits per character) above which a base64-like string
    of 20 characters or more is taken as a secret (detect-secrets' default, 4.5); ``None``: no
    entropy detector."""

    def __init__(self, user_patterns: list[str] | None = None, replacement: str = "[REDACTED]",
                 detect: bool = True, entropy_limit: float | None = 4.5) -> None:
        self.user = [(p, re.compile(p)) for p in (user_patterns or [])]
        self.replacement = replacement
        self.detect = detect
        self.entropy_limit = entropy_limit
        self.named = [(k, re.compile(p)) for k, p in PATTERNS.items()] if detect else []
        self.counts: dict[str, int] = {p: 0 for p, _ in self.user}
        self._plugins = None

    # -- the library ---------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        plugins = [{"name": n} for n in PLUGINS if n != "Base64HighEntropyString" or self.entropy_limit is not None]
        for p in plugins:
            if p["name"] == "Base64HighEntropyString":
                p["limit"] = self.entropy_limit
        return {"plugins_used": plugins}

    def __enter__(self) -> "Redactor":
        """Scans run inside detect-secrets' ``transient_settings`` (its settings are process-global:
        settings.py:76); the previous settings come back on exit."""
        if self.detect:
            try:
                from detect_secrets.settings import transient_settings
            except ImportError as exc:  # a dependency of the package (pyproject.toml)
                raise ImportError("export.detect_secrets=true needs detect-secrets (pip install -c constraints.txt "
                                  "-e .), or set export.detect_secrets=false") from exc

            _kingfisher()  # its rules compiled (or read from the cache) before the first string
            self._ctx = transient_settings(self._settings())
            self._ctx.__enter__()
            self._scan.cache_clear()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.detect:
            self._ctx.__exit__(*exc)
            self._scan.cache_clear()

    @staticmethod
    @lru_cache(maxsize=65536)  # episodes repeat their instructions and observations line for line
    def _scan(line: str, entropy_limit: float | None) -> tuple[tuple[str, str], ...]:
        from detect_secrets.core.scan import scan_line
        from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

        found = []
        for s in scan_line(line):
            value = s.secret_value or ""
            if not value:
                continue
            if s.type == ENTROPY:  # ad-hoc scans leave the limit to the caller (see the module doc)
                if entropy_limit is not None:
                    plugin = Base64HighEntropyString(entropy_limit)
                    found += [(s.type, v) for v in _entropy_candidates(value)
                              if plugin.calculate_shannon_entropy(v) > entropy_limit]
                continue
            elif s.type == "Hex High Entropy String":
                continue
            found.append((s.type, value))
        return tuple(found)

    def _library_spans(self, text: str, entropy: bool) -> list[tuple[int, int, str]]:
        """The spans of the library's findings in ``text``: the named plugins' (``entropy=False``)
        or the high-entropy detector's (run after them, on what they left)."""
        spans = []
        offset = 0
        for line in text.splitlines(keepends=True):
            if line.strip():
                for kind, value in self._scan(line, self.entropy_limit):
                    if (kind == ENTROPY) != entropy:
                        continue
                    for m in re.finditer(re.escape(value), line):
                        a, b = (m.start(), m.end()) if entropy else _widen(line, m.start(), m.end())
                        spans.append((offset + a, offset + b, kind))
            offset += len(line)
        return spans

    # -- the public API ------------------------------------------------------------------------
    def text(self, s: str) -> str:
        """``s`` with every secret replaced by ``replacement``."""
        for p, rx in self.user:
            s = _replace_spans(s, _pattern_spans(rx, s, p), self.replacement, self.counts)
        if not self.detect or not s:
            return s
        spans = [sp for kind, rx in self.named for sp in _pattern_spans(rx, s, kind)]
        s = _replace_spans(s, spans, self.replacement, self.counts)
        s = _replace_spans(s, self._library_spans(s, False), self.replacement, self.counts)
        s = _replace_spans(s, [(m.start(), m.end(), kind) for kind, value in _kingfisher_scan(s)
                               for m in re.finditer(re.escape(value), s)], self.replacement, self.counts)
        return _replace_spans(s, self._library_spans(s, True), self.replacement, self.counts)

    def __call__(self, obj: Any) -> Any:
        """Every string in ``obj`` (nested lists and dicts; keys are kept) redacted."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, list):
            return [self(x) for x in obj]
        if isinstance(obj, dict):
            return {k: self(v) for k, v in obj.items()}
        return obj
