"""What both sides read to authenticate: PEM files, and the shared token (where it comes from,
how it travels, and the constant-time check)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import stat
from pathlib import Path

from ember.env import env_value

log = logging.getLogger(__name__)

TOKEN_ENV = "EMBER_AUTH_TOKEN"
# The gRPC metadata entry that carries it: ``authorization: Bearer <token>``.
METADATA_KEY = "authorization"
_SCHEME = b"Bearer "
MIN_TOKEN_CHARS = 16


def read_pem(path: str, what: str) -> bytes:
    """The bytes of the PEM file ``path``; ValueError naming ``what`` it is if unreadable."""
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {path}: {error}") from None


def load_token(token_file: str) -> bytes | None:
    """The token in ``token_file`` (one line), else in ``EMBER_AUTH_TOKEN``, else None.

    Raises:
        ValueError: the file cannot be read, or the token is shorter than
            :data:`MIN_TOKEN_CHARS` or not printable ASCII without spaces.
    """
    if token_file:
        path = Path(token_file)
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"cannot read the token file {token_file}: {error}") from None
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("token file %s is readable by other users: chmod 600 it", token_file)
        where = f"token file {token_file}"
    else:
        text = token_in_environment()
        if not text:
            return None
        where = TOKEN_ENV
    if len(text) < MIN_TOKEN_CHARS or not (text.isascii() and text.isprintable()) or " " in text:
        raise ValueError(
            f"the token in {where} must be at least {MIN_TOKEN_CHARS} printable ASCII characters "
            "without spaces"
        )
    return text.encode("ascii")


def token_in_environment() -> str:
    """The token in ``EMBER_AUTH_TOKEN`` ('' : none)."""
    return env_value("AUTH_TOKEN", "").strip()


def authorization_value(token: bytes) -> str:
    """The metadata value a client sends with ``token``."""
    return (_SCHEME + token).decode("ascii")


def token_matches(expected: bytes, metadata_value: str | bytes | None) -> bool:
    """Whether an ``authorization`` metadata value carries ``expected``. Their SHA-256
    digests are compared in constant time, so the time depends on neither the token's
    content, nor how much of it matched, nor its length."""
    if metadata_value is None:
        return False
    given = (
        metadata_value.encode("ascii", "replace")
        if isinstance(metadata_value, str)
        else metadata_value
    )
    return hmac.compare_digest(_digest(_SCHEME + expected), _digest(given))


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()
