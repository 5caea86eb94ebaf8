"""Credentials in URLs never reach a message: ``redaction.scrub`` on every spelling a client
or a report may use, ZeroBatch's exceptions, and the command line's messages for commands that
echo their arguments (``trace``, ``convert``, ``write``).

The object-store side (client errors from a real server, ``inspect``, ``validate`` and
``dataset reclaim`` of URLs) is in ``tests/remote/test_redaction_remote.py``.
"""

from __future__ import annotations

import errno
import json
import secrets
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import ErrorCode, Violation

from zerobatch_core.cli import main
from zerobatch_core.errors import FormatError, ZeroBatchIOError
from zerobatch_core.redaction import redact, remember, scrub, secrets_of
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import StoreError


def _password() -> str:
    """A password no other test uses, so that one test's remembered secret cannot hide another
    test's leak; it contains the word ``password`` that no output may show."""
    return f"password{secrets.token_hex(6)}"


def test_scrub_drops_user_information_in_every_spelling() -> None:
    pw = _password()
    texts = [
        f"Error performing GET https://user:{pw}@127.0.0.1:9000/b/k in 2ms",
        f"two: s3://AKID:{pw}@bucket/a and gs://tok:{pw}@b/c",
        f"quoted 'https://user:{pw}@host/x' and <http://u:{pw}@h>",
        f"encoded https%3A%2F%2Fuser%3A{pw}%40host%2Fx",
        f"half-encoded https%3A//user%3A{pw}%40host/x",
        f"an @ in it: https://user:p%40{pw}@host/x",
        json.dumps({"path": f"https://user:{pw}@host/ds"}),
    ]
    for text in texts:
        cleaned = scrub(text)
        assert pw not in cleaned and "password" not in cleaned, (text, cleaned)
    assert scrub(texts[0]) == "Error performing GET https://127.0.0.1:9000/b/k in 2ms"
    # Text without user information is left alone, @ in paths included.
    plain = "s3://bucket/data/a@b.batch: checksum_mismatch: slot 3 (user@example.org)"
    assert scrub(plain) == plain


def test_scrub_takes_linear_time_on_hostile_text() -> None:
    """Messages quote names from hostile manifests: no text makes scrubbing slow."""
    n = 400_000
    for text in (
        "a" * n,
        "a://" * (n // 4),
        "a://b" * (n // 5) + "@",
        "https%3A%2F%2F" * (n // 14) + "%40",
        ("x" * 50 + ".") * (n // 51) + "://u:p@h",
    ):
        started = time.perf_counter()
        cleaned = scrub(text)
        assert time.perf_counter() - started < 2.0, text[:40]
        assert "u:p@" not in cleaned


def test_scrub_finds_user_information_after_text_that_lowercases_longer() -> None:
    """Positions are taken in the text itself: ``"İ".lower()`` is two characters, so positions
    found in a lowercased copy would cut the wrong span of the original."""
    pw = _password()
    text = f"İİİİ see https://user:{pw}@host/x and İ https%3A%2F%2Fu%3A{pw}%40h%2Fp"
    assert scrub(text) == "İİİİ see https://host/x and İ https%3A%2F%2Fh%2Fp"


def test_scrub_cuts_an_encoded_authority_at_its_encoded_slash() -> None:
    """In a percent-encoded URL the authority ends at ``%2F`` (any case): an ``%40`` after it
    is in the path, not user information."""
    assert scrub("https%3A%2F%2Fhost%2fpath%40x") == "https%3A%2F%2Fhost%2fpath%40x"
    assert scrub("https%3a%2f%2fu%3Apw%40host%2Fpath%40x") == "https%3a%2f%2fhost%2Fpath%40x"


def test_a_remembered_secret_is_scrubbed_alone_in_every_encoding() -> None:
    pw = _password() + '/é+ "x'  # characters that percent-encoding and JSON change
    url = "https://user:" + __import__("urllib.parse").parse.quote(pw, safe="") + "@host/ds"
    found = secrets_of(url)
    assert pw in found and json.dumps(pw)[1:-1] in found
    remember(url)
    for shown in (pw, url.split(":", 2)[2].split("@")[0], json.dumps({"detail": pw})):
        cleaned = scrub(f"the client says: invalid secret {shown}!")
        assert "password" not in cleaned and "***" in cleaned, cleaned
    # A token given as the user name is the secret when there is no password.
    token = "tok" + secrets.token_hex(8)
    assert secrets_of(f"https://{token}@host/x") == {token}
    # One- and two-character secrets are not replaced everywhere; their URL form still goes.
    assert secrets_of("https://u:ab@host/x") == set()
    assert scrub("https://u:ab@host/x, about") == "https://host/x, about"


def test_redact_keeps_only_scheme_host_port_and_path() -> None:
    assert redact("https://user:secret@host:9000/p?sig=abc#f") == "https://host:9000/p"
    assert redact("s3://AKID:secret@bucket/prefix") == "s3://bucket/prefix"
    assert "secret" not in redact("https://user:secret@host:notaport/p")


def test_zerobatch_errors_never_show_credentials() -> None:
    pw = _password()
    url = f"https://user:{pw}@host/data/x.batch"
    errors: list[Exception] = [
        FormatError(url, Violation(ErrorCode.BAD_MAGIC, "magic", f"read from {url}")),
        ZeroBatchIOError(errno.EIO, f"failed: GET {url}", url),
        StoreError(errno.EIO, f"read failed: {url}", url),
    ]
    for error in errors:
        for text in (str(error), "".join(traceback.format_exception(error))):
            assert pw not in text and "password" not in text, text


def test_an_unopenable_store_url_is_reported_without_its_password() -> None:
    pw = _password()
    with pytest.raises(OSError) as caught:
        open_store(f"ftp://user:{pw}@host/x")
    assert pw not in str(caught.value) and "ftp://host/x" in str(caught.value)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    status = main(argv)
    out = capsys.readouterr()
    return status, out.out + out.err


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_commands_that_echo_their_arguments_never_print_a_password(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    json_flag: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # a URL taken for a relative path stays in here
    pw = _password()
    url = f"https://user:{pw}@127.0.0.1:9/data"
    text = tmp_path / "a.txt"
    text.write_text("hello world\n")
    tokens = tmp_path / "t.npy"
    np.save(tokens, np.arange(32, dtype=np.uint32).reshape(8, 4))
    shape = ["--seq-len", "4", "--batch-size", "2"]
    commands = [
        ["trace", url, "--step", "0"],
        ["trace", f"{url}/train.batch", "--step", "3"],
        ["convert", f"{url}/a.txt", str(tmp_path / "o.batch"), *shape],
        ["convert", f"{url}/*.txt", str(tmp_path / "o.batch"), *shape],
        ["convert", str(text), f"{url}/o.batch", *shape],
        ["convert", str(text), f"{url}/o", *shape, "--shard-size", "2"],
        ["write", str(tokens), f"{url}/o.batch", "--batch-size", "2"],
        ["--debug", "trace", url, "--step", "0"],
    ]
    for argv in commands:
        status, output = _run(capsys, [*argv, *json_flag])
        assert status == 2, (argv, status, output)
        assert pw not in output and "password" not in output, (argv, output)
        assert "127.0.0.1:9" in output, (argv, output)  # still says which URL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "t.npy"]  # nothing written
