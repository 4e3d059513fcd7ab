"""Config errors: one user-facing line per problem, with secrets redacted."""

import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any, NoReturn

from pydantic_core import PydanticCustomError

Loc = tuple[str | int, ...]


class ConfigError(Exception):
    """A configuration problem; ``str(e)`` is the full user-facing message (one line per problem)."""

    def __init__(self, message: str, problems: Sequence[str] | None = None) -> None:
        # Redact here too, so a message built anywhere can never leak a password into logs or the UI.
        message = redact(message)
        super().__init__(message)
        self.problems: list[str] = (
            [redact(p) for p in problems] if problems is not None else message.splitlines()
        )


_URL_PASSWORD_RE = re.compile(
    # scheme://user:PASSWORD@host. The password runs to the last '@' before the first '/', as libpq
    # parses it (so a raw '#' or '?' in a password is still masked).
    r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:)(?P<secret>[^\s/]*)(?=@)"
)
_SECRET_WORD = r"[\w-]*(?:password|passwd|pwd|secret|token|api[_-]?key)"
_SECRET_VALUE = r"(?P<secret>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&,;'\"]+)"
_KEY_VALUE_SECRET_RES = (
    # libpq key/value DSNs and query strings: password=..., sslpassword='...', ?token=...&
    re.compile(rf"(?i)(?P<pre>(?<![\w-]){_SECRET_WORD}\s*=\s*){_SECRET_VALUE}"),
    # JSON/dict-ish text: "password": "...". Unquoted `key: value` is left alone, because error
    # lines themselves have the form `path.to.key: message`.
    re.compile(rf"(?i)(?P<pre>[\"'](?:{_SECRET_WORD}|authorization)[\"']\s*:\s*){_SECRET_VALUE}"),
    # HTTP credentials: Authorization: Bearer ...
    re.compile(r"(?i)(?P<pre>\b(?:bearer|basic)\s+)(?P<secret>[A-Za-z0-9._~+/=\-]{8,})"),
    # libpq's DSN parse errors quote the token they choke on, often the password itself.
    re.compile(r'(?P<pre>(?:invalid percent-encoded token|missing "=" after|unterminated quoted string in '
               r'connection info string|invalid URI query parameter)[^"]*)(?P<secret>"[^"]*")'),
)


def redact(text: str) -> str:
    """Mask anything that looks like a password in ``text`` (DSN/URL userinfo, ``password=...``).

    ``postgresql://u:pw@h/db`` becomes ``postgresql://u:***@h/db``; ``password=pw`` becomes
    ``password=***``. Used for error messages and logs.
    """
    text = _URL_PASSWORD_RE.sub(r"\g<pre>***", text)
    for pattern in _KEY_VALUE_SECRET_RES:
        text = pattern.sub(r"\g<pre>***", text)
    return text


PROBLEMS = "cdc_config_problems"
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def format_loc(loc: Sequence[Any]) -> str:
    out = ""
    for el in loc:
        if isinstance(el, int):
            out += f"[{el}]"
        elif isinstance(el, str) and _PLAIN_KEY_RE.match(el):
            out += f".{el}" if out else el
        else:
            # Keys like "spark.sql.shuffle.partitions" would be ambiguous with dots.
            out += f"[{str(el)!r}]"
    return out


def fail(*problems: tuple[Loc, str]) -> NoReturn:
    """Raise several problems at once from a validator, each with a path relative to the validator.

    Pydantic gives one error per validator, at the validator's location; the converter in
    ``validation_lines`` expands these back into separate lines at their precise paths.
    """
    summary = "; ".join(f"{format_loc(loc) or '.'}: {msg}" for loc, msg in problems)
    raise PydanticCustomError(PROBLEMS, "{summary}", {"summary": summary, "problems": list(problems)})


# --------------------------------------------------------------------------------------------------
# Shared validators


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, datetime | date):
        return "a date"
    return type(value).__name__



class RedactedError(RuntimeError):
    """An error re-raised with its secrets masked (its cause is dropped: the cause's text holds them)."""


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception with secrets masked: for logs, metadata and stored errors."""
    return redact(f"{type(exc).__name__}: {exc}")


def without_secrets(exc: BaseException) -> BaseException:
    """``exc`` itself when its text holds nothing to mask, else a RedactedError with the masked text; re-raise
    the result ``from None`` so neither the message nor the chained cause shows a secret."""
    text = f"{type(exc).__name__}: {exc}"
    masked = redact(text)
    return exc if masked == text and exc.__cause__ is None and exc.__context__ is None else RedactedError(masked)
