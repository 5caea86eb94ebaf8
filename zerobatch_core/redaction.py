"""Credentials never reach a message: URLs shown without user information, and any text scrubbed.

A URL may carry credentials in its user information (``https://user:password@host/...``,
``s3://KEY:SECRET@bucket/...``). ZeroBatch never shows them: ``redact`` turns one URL into its
shown form (no user information, no query), and ``scrub`` cleans any text (a message, a report,
an object-store client's error) of

- every ``scheme://userinfo@`` form, raw or percent-encoded (``https%3A%2F%2Fuser%3Apw%40``):
  the user information is dropped, as ``redact`` drops it; and
- the literal secrets of every URL this process was given (``remember``): the password, or the
  user name where a URL has no password (a token given as the user name), each raw,
  percent-decoded, percent-encoded and JSON-escaped, replaced by ``***``. Clients sometimes
  quote the password alone ("invalid secret 'hunter2'"), which no URL pattern would find.

``Store`` remembers the URL it is opened with, and the command line remembers every URL in its
arguments, so a secret is scrubbed from every message once any part of ZeroBatch has seen it.
Secrets shorter than ``MIN_SECRET`` characters are not replaced as literals (replacing every
``"a"`` would garble the message and hide nothing); their URL form is still dropped. A query
string is left in free text (``redact`` drops it from the URLs ZeroBatch shows itself): a
pre-signed URL's signature expires, and its ``X-Amz-Credential`` names a key, not a secret.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse

MIN_SECRET = 3
"""The shortest secret replaced wherever it appears in a text (see the module docstring)."""

MASK = "***"
"""What a literal secret is replaced by."""

_SCHEME = re.compile(r"(?i)(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*(://|%3a%2f%2f|%3a//)")
"""A URL's ``scheme://``, raw or percent-encoded. It matches only where a run of scheme
characters starts, so that a long run is scanned once, not once per character."""

_SEGMENT_END = re.compile(r"[\s/?#\"'<>`]")
"""What ends a URL's authority (``/``, ``?``, ``#``) or the URL itself in a message."""

_ENCODED_SLASH = re.compile(r"(?i)%2f")
"""What also ends the authority of a percent-encoded URL."""

_THROUGH_USERINFO = re.compile(r"(?s).*(?:@|%40)")
"""An authority from its start through the last ``@`` (or ``%40``): the user information and
the sign that ends it. Anchored at the start (``match``), so one try scans the authority once."""

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()


def redact(url: str) -> str:
    """``url`` without user information or query (credentials never reach a message)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<unparseable URL>"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def secrets_of(url: str) -> set[str]:
    """The literal secrets of ``url``: its password (else its user name), in every spelling a
    message may hold it (raw, percent-decoded, percent-encoded, escaped inside a JSON string);
    empty for a URL without."""
    userinfo = _userinfo(url)
    if userinfo is None:
        return set()
    user, colon, password = userinfo.partition(":")
    secret = password if colon and password else user
    found = {secret, urllib.parse.unquote(secret)}
    found |= {urllib.parse.quote(s, safe="") for s in list(found)}
    found |= {json.dumps(s)[1:-1] for s in list(found)}
    return {s for s in found if len(s) >= MIN_SECRET}


def _userinfo(url: str) -> str | None:
    """The user information of ``url`` as written, or ``None``."""
    authority = url.partition("://")[2]
    for stop in "/?#":
        authority = authority.partition(stop)[0]
    userinfo, at, _ = authority.rpartition("@")
    return userinfo if at else None


def remember(url: str) -> None:
    """Scrub the secrets of ``url`` from every later message of this process (``scrub``)."""
    found = secrets_of(url)
    if not found:
        return
    global _secrets
    with _lock:
        merged = set(_secrets) | found
        # Longest first, so a secret that contains another is replaced whole.
        _secrets = tuple(sorted(merged, key=lambda s: (-len(s), s)))


def drop_userinfo(text: str) -> str:
    """``text`` with the user information of every URL in it removed: from ``scheme://`` to
    the last ``@`` (or ``%40``) of the authority, as ``urllib.parse`` splits it.

    The authority ends at ``/``, ``?``, ``#``, a quote or a space, and in a percent-encoded URL
    also at ``%2F``. Each authority is examined once, so the time is linear in the text's
    length whatever it holds (messages can quote hostile names of any length).
    """
    kept: list[str] = []
    copied = searched = 0
    while (found := _SCHEME.search(text, searched)) is not None:
        start = found.end()
        stop = _SEGMENT_END.search(text, start)
        authority = text[start : stop.start() if stop else len(text)]
        if found.group(1) != "://":
            authority = _ENCODED_SLASH.split(authority)[0]
        userinfo = _THROUGH_USERINFO.match(authority)
        if userinfo is not None:
            kept.append(text[copied:start])
            copied = start + userinfo.end()
        searched = start + len(authority)
    kept.append(text[copied:])
    return "".join(kept)


def scrub(text: str, extra: tuple[str, ...] | set[str] = ()) -> str:
    """``text`` without user information in any URL, nor any remembered (or ``extra``) secret."""
    cleaned = drop_userinfo(text)
    known = _secrets
    if extra:
        more = {s for s in extra if len(s) >= MIN_SECRET}
        known = tuple(sorted(set(known) | more, key=lambda s: (-len(s), s)))
    for secret in known:
        if secret in cleaned:
            cleaned = cleaned.replace(secret, MASK)
    return cleaned
