"""URLs with credentials against a real S3-compatible server (``tests/s3server.py``): no
message, report, traceback or exception text shows the password, whatever the object-store
client puts in its errors; remote ``validate`` and ``inspect`` report a broken manifest as the
local commands do; the exit statuses of README's table for remote sources; a request the server
refuses (403) is not retried.

The URL forms: ``s3://KEY:password@bucket/...`` (the client signs with the environment's
credentials and ignores the user information), ``http://user:password@127.0.0.1:PORT/...``
(the server answers 403 or 404, and the client's error text quotes the URL it requested), and
``https://user:password@127.0.0.1:PORT/...`` (a TLS handshake with a plain HTTP server fails,
is retried, and the final error quotes the URL).
"""

from __future__ import annotations

import json
import pickle
import secrets
import traceback
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import records
from tests.remote.conftest import upload
from tests.s3server import S3Server
from zerobatch_core.cli import main
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource
from zerobatch_core.delivery.sources import open_reader
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import RetryPolicy, StoreError

B, T = 4, 8
FAST = RetryPolicy(attempts=3, base=0.001, cap=0.002)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(64, T)], batch_size=B, seq_len=T, shard_batches=4, seed=5)
    return out


def _password() -> str:
    """A password no other test uses (one test's remembered secret cannot hide another's
    leak), containing the word ``password`` that no output may show."""
    return f"password{secrets.token_hex(6)}"


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    status = main(argv)
    out = capsys.readouterr()
    return status, out.out + out.err


def test_no_command_prints_the_password_of_a_url(
    dataset: Path, bucket: str, s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    upload(dataset, f"s3://{bucket}/ds")
    pw = _password()
    host = f"127.0.0.1:{s3_server.port}"
    sources = {
        f"s3://AKID:{pw}@{bucket}/missing": 2,  # no such object
        f"http://user:{pw}@{host}/no-such-bucket/ds": 2,  # 404, quoted by the client
        f"http://user:{pw}@{host}/{bucket}/ds": 2,  # 403: unsigned requests are refused
    }
    for url, expected in sources.items():
        for argv in (
            ["inspect", url],
            ["inspect", "--json", url],
            ["validate", url],
            ["validate", "--json", url],
            ["validate", "--deep", "--json", url],
            ["--debug", "validate", url],
        ):
            status, output = _run(capsys, argv)
            assert status == expected, (argv, status, output)
            assert pw not in output and "password" not in output, (argv, output)
            assert "internal error" not in output, (argv, output)
    # The client's own retries (TLS to a plain HTTP port), then reclaim and trace.
    url = f"https://user:{pw}@{host}/{bucket}/ds"
    for argv in (
        ["dataset", "reclaim", url],
        ["dataset", "reclaim", "--dry-run", "--json", url],
        ["inspect", url],
        ["trace", url, "--step", "0"],
    ):
        status, output = _run(capsys, argv)
        assert status == 2, (argv, status, output)
        assert pw not in output and "password" not in output, (argv, output)
        assert f"https://{host}/{bucket}/ds" in output, output  # the URL, redacted


def test_a_valid_dataset_behind_a_url_with_credentials_never_shows_them(
    dataset: Path, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upload(dataset, f"s3://{bucket}/ds")
    pw = _password()
    url = f"s3://AKID:{pw}@{bucket}/ds"
    for argv in (["inspect", "--json", url], ["validate", "--deep", "--json", url]):
        status, output = _run(capsys, argv)
        assert status == 0 and json.loads(output)["path"] == f"s3://{bucket}/ds", output
        assert pw not in output
    with RemoteSource(url) as source:
        assert pw not in source.path and pw not in repr(source)
        with pytest.raises(IndexError) as caught:
            source.read_batch(source.num_batches)
        assert pw not in str(caught.value) and f"s3://{bucket}/ds" in str(caught.value)
        first = source.read_batch(0)
        # A worker process reopens the URL as given (credentials and all), and shows it
        # redacted like the original.
        with pickle.loads(pickle.dumps(source)) as again:
            assert np.array_equal(again.read_batch(0), first)
            assert again.path == f"s3://{bucket}/ds"


def test_api_errors_never_show_the_password(bucket: str, s3_server: S3Server) -> None:
    pw = _password()
    host = f"127.0.0.1:{s3_server.port}"
    attempts = [
        (f"http://user:{pw}@{host}/no-such-bucket/ds", FileNotFoundError),
        (f"http://user:{pw}@{host}/{bucket}/ds", OSError),  # 403 or 404: unsigned
        (f"s3://AKID:{pw}@{bucket}/missing.batch", FileNotFoundError),
    ]
    for url, expected in attempts:
        with pytest.raises(expected) as caught:
            open_reader(url)
        text = "".join(traceback.format_exception(caught.value))  # causes included
        assert pw not in text and "user:" not in text, text
        assert caught.value.filename is not None and pw not in str(caught.value.filename)
    store = open_store(f"https://user:{pw}@{host}/{bucket}/ds", retry=FAST)
    with pytest.raises(StoreError, match="still failing after 3 attempts") as failed:
        store.read("manifest.json")
    text = "".join(traceback.format_exception(failed.value))
    assert pw not in text and "user:" not in text, text
    assert failed.value.filename == f"https://{host}/{bucket}/ds/manifest.json"


def test_a_refused_request_is_reported_at_once_not_retried(
    bucket: str, s3_server: S3Server
) -> None:
    open_store(f"s3://{bucket}/ds").write("manifest.json", b"{}")
    store = open_store(f"http://127.0.0.1:{s3_server.port}/{bucket}/ds")  # unsigned: 403
    with pytest.raises(StoreError, match="403") as caught:
        store.size("manifest.json")
    assert "still failing" not in str(caught.value)
    assert store.stats.retries == 0 and store.stats.retry_reasons == {}


def test_remote_validate_and_inspect_report_a_broken_manifest_like_the_local_commands(
    dataset: Path, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = dataset / "manifest.json"
    broken = json.loads(manifest.read_text())
    broken["batch_size"] = -1
    manifest.write_text(json.dumps(broken))
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    status, output = _run(capsys, ["validate", "--json", str(dataset)])
    local = json.loads(output)
    assert status == 1 and not local["valid"]
    (failure,) = local["failures"]
    for deep in ([], ["--deep"]):
        status, output = _run(capsys, ["validate", "--json", *deep, url])
        report = json.loads(output)
        assert status == 1, output
        assert (report["path"], report["valid"], report["deep"]) == (url, False, bool(deep))
        assert report["error"] == {
            "code": failure["code"],
            "field": failure["where"],
            "detail": failure["detail"],
        }
        assert len(report["failures"]) == 1 and failure["code"] in report["failures"][0]
    status, output = _run(capsys, ["validate", url])
    assert status == 1 and output.startswith(f"INVALID {url}: 1 failure\n"), output
    assert "manifest_bad_field" in output
    status, output = _run(capsys, ["inspect", "--json", url])
    assert status == 1
    first = output.splitlines()[0]
    assert json.loads(first) == {
        "path": url,
        "valid": False,
        "error": {"code": failure["code"], "field": failure["where"], "detail": failure["detail"]},
    }
    status, output = _run(capsys, ["inspect", "--json", str(dataset)])
    assert status == 1 and json.loads(output.splitlines()[0])["error"]["code"] == failure["code"]


def test_remote_exit_statuses_follow_the_readme_table(
    dataset: Path, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    unreadable = [f"s3://{bucket}/missing", f"s3://{bucket}/ds/missing.batch", "s3://no-such-b/x"]
    for source in unreadable:  # a path that cannot be read: 2, naming it
        for command in ("inspect", "validate"):
            status, output = _run(capsys, [command, source])
            assert status == 2, (command, source, output)
            assert source in output or source.rsplit("/", 1)[0] in output, output
    store = open_store(url)
    store.write("shard-00001.batch", store.read("shard-00001.batch")[:-1])  # a short shard
    status, output = _run(capsys, ["validate", url])  # invalid data: 1
    assert status == 1 and "shard_size_mismatch" in output, output
    status, output = _run(capsys, ["validate", "--json", url])
    assert status == 1 and not json.loads(output)["valid"]
