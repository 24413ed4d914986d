"""The one owner of secrets: everything grpo_lab writes or prints passes through :func:`redact`.

What is masked (as ``***``):

- the password of a URL: ``postgresql+psycopg2://user:***@host/db``;
- the value of every secret-looking environment variable (``WANDB_API_KEY``, ``HF_TOKEN``, any
  ``*_TOKEN``, ``*_KEY``, ``*_SECRET``, ``*PASSWORD*``...) wherever it appears in a text, once it is at
  least 6 characters long (shorter values would mask ordinary words);
- in mappings, the value of a secret-looking key (``api_key``, ``hub_token``, ``password``...), and in
  texts the value after such a key (``api_key=...``, ``"token": "..."``).

Used by the log handlers (:class:`RedactingFilter`, installed by ``conf/hydra/job_logging/grpo_lab.yaml``),
the run folder's files (``files``, ``run_folder``), the tracker (W&B config, summary), the CLI (the command
line W&B records), ``compare`` and the sweeper. A job that must *use* a masked URL (a sweep trial reporting
to its storage) gets it back with :func:`reveal`, from the process environment the sweeper shares it through
(:func:`share`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

# Values shorter than this are not masked as literals: a 3-character "key" would hide words everywhere.
MIN_SECRET_LENGTH = 6

# The environment variable through which a sweeper hands jobs the real URLs it masked (see `share`).
SHARED_URLS_ENV = "GRPO_LAB_SECRET_URLS"

# A name (environment variable, config key, `key=value` in a text) whose value is a secret.
_SECRET_NAME = re.compile(
    r"password|passwd|secret|credential|api_?key|private_?key|access_?token|auth_?token"
    r"|[a-z0-9]_(token|key)$|^(token|apikey|auth)$",
    re.IGNORECASE,
)
# Tokenizer settings end in `_token` and hold no secret.
_NOT_SECRET = re.compile(r"^(pad|eos|bos|unk|sep|cls|mask|im_start|im_end|think|special)_token$", re.IGNORECASE)

# scheme://user:password@host -> scheme://user:***@host (a password with `/` or `@` is percent-encoded);
# also as Hydra escapes it in overrides: scheme\://user\:password@host.
_URL_PASSWORD = re.compile(r"(?P<pre>\b[a-zA-Z][a-zA-Z0-9+.\-]*\\?://[^:/@\s'\"\\]*)(?P<sep>\\?:)(?P<pw>[^@\s/'\"]+)@")


def _mask_url(match: re.Match[str]) -> str:
    if match["pw"] == MASK or match["pw"].startswith(("${", "$\\{")):  # an interpolation holds no secret
        return match[0]
    return f"{match['pre']}{match['sep']}{MASK}@"


# name=value, name: value, "name": "value" (overrides, commands, URL queries, YAML and JSON lines).
_KEY_SEP = re.compile(r"(?P<name>[A-Za-z_][\w.\-]*)['\"]?[ \t]*[=:][ \t]*['\"]?")
_VALUE = re.compile(r"[^\s'\",;&}\])]+")
# Values after a secret-looking name that are no secret.
_NOT_A_VALUE = {"null", "none", "None", "~", "true", "false", "True", "False", "???", MASK}

# Secret values met in mappings (a config's `api_key: ...`): masked from then on in texts too.
_known: set[str] = set()


def is_secret_name(name: str) -> bool:
    """Whether `name` (an environment variable, a config key or a dotted override key) names a secret.

    >>> [is_secret_name(n) for n in ("WANDB_API_KEY", "HF_TOKEN", "DB_PASSWORD", "reward.kwargs.api_key")]
    [True, True, True, True]
    >>> [is_secret_name(n) for n in ("max_new_tokens", "pad_token", "storage", "key", "exclude_keys")]
    [False, False, False, False, False]
    """
    last = name.rsplit(".", 1)[-1].lstrip("+~")
    return bool(_SECRET_NAME.search(last)) and not _NOT_SECRET.match(last)


def _secret_values() -> list[str]:
    values = {
        v
        for k, v in os.environ.items()
        if len(v) >= MIN_SECRET_LENGTH and is_secret_name(k) and k != SHARED_URLS_ENV  # URLs: masked as URLs
    }
    values |= _known
    return sorted(values, key=len, reverse=True)  # longest first: a secret that contains another


def _mask_key_values(text: str) -> str:
    out, done = [], 0
    for match in _KEY_SEP.finditer(text):
        if match.start() < done or not is_secret_name(match["name"]) or text.endswith("://", 0, match.start()):
            continue  # (a URL's user name, followed by its password: masked as a URL)
        value = _VALUE.match(text, match.end())
        if value is None or value[0] in _NOT_A_VALUE or value[0].startswith((MASK, "${", "$\\{")):
            continue  # an interpolation such as ${oc.env:MY_KEY} names a secret without holding it
        out += [text[done : value.start()], MASK]
        done = value.end()
    return "".join(out) + text[done:] if out else text


def _redact_text(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    if "://" in text:
        text = _URL_PASSWORD.sub(_mask_url, text)
    if "=" in text or ":" in text:
        text = _mask_key_values(text)
    return text


def _is_secret_value(item: Any) -> bool:
    if isinstance(item, str):
        return item not in ("", MASK) and not item.startswith("${")  # ${oc.env:MY_KEY} holds no secret
    return isinstance(item, int | float) and not isinstance(item, bool)


def _redact(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return _redact_text(value, secrets)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if isinstance(key, str) and is_secret_name(key) and _is_secret_value(item):
                if len(str(item)) >= MIN_SECRET_LENGTH:
                    _known.add(str(item))
                out[key] = MASK
            else:
                out[_redact(key, secrets) if isinstance(key, str) else key] = _redact(item, secrets)
        return out
    if isinstance(value, list | tuple):
        return type(value)(_redact(v, secrets) for v in value)
    return value


def redact(value: Any) -> Any:
    """`value` with its secrets masked: a str, or a mapping / list / tuple (recursively, as plain dict/list/tuple).

    >>> redact("sqlite:///a.db and postgresql+psycopg2://me:s3cret@db:5432/optuna")
    'sqlite:///a.db and postgresql+psycopg2://me:***@db:5432/optuna'
    >>> redact({"lr": 1e-5, "judge": {"api_key": "sk-123456", "url": "https://x.org"}, "tags": ("a=b",)})
    {'lr': 1e-05, 'judge': {'api_key': '***', 'url': 'https://x.org'}, 'tags': ('a=b',)}
    >>> redact("+reward.functions.judge.kwargs.api_key=sk-123456 lr=1e-5")
    '+reward.functions.judge.kwargs.api_key=*** lr=1e-5'
    >>> redact("api_key=${oc.env:MY_KEY}")  # an interpolation holds no secret
    'api_key=${oc.env:MY_KEY}'

    Other types (numbers, None, objects) are returned unchanged.
    """
    if not isinstance(value, str | Mapping | list | tuple):
        return value
    return _redact(value, _secret_values())


def share(url: str) -> str:
    """Mask `url` for job overrides and files, and keep the real one for :func:`reveal` in this process and its
    children (through the environment variable ``GRPO_LAB_SECRET_URLS``). Returns the masked URL."""
    masked = redact(url)
    if masked != url:
        shared = [u for u in os.environ.get(SHARED_URLS_ENV, "").split("\n") if u]
        if url not in shared:
            os.environ[SHARED_URLS_ENV] = "\n".join([*shared, url])
    return masked


def reveal(url: str) -> str:
    """The real URL behind a masked one, when this process (or its parent) shared it; else `url` unchanged.

    A URL whose password is nowhere to be found keeps working when the database finds the password
    elsewhere (PostgreSQL: ``PGPASSWORD`` or ``~/.pgpass``): see :func:`without_password`.
    """
    if MASK not in url:
        return url
    for candidate in os.environ.get(SHARED_URLS_ENV, "").split("\n"):
        if candidate and _URL_PASSWORD.sub(_mask_url, candidate) == url:
            return candidate
    return url


def without_password(url: str) -> str:
    """``scheme://user:***@host`` -> ``scheme://user@host`` (the driver then looks the password up itself)."""
    return url.replace(f":{MASK}@", "@")


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in every record's message, arguments and traceback.

    Installed on the console and file handlers by ``conf/hydra/job_logging/grpo_lab.yaml``::

        filters:
          redact: {(): grpo_lab.redact.RedactingFilter}
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the formatter to report
            return True
        record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
