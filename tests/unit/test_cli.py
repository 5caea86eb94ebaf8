"""The zerobatch command line: output, JSON, help, error messages and the exit-status contract.

Exit statuses (``zerobatch_core.cli.EXIT_CODES``): 0 success, 1 invalid file or data, 2 usage
error or unreadable path, 3 missing optional dependency, 70 internal error, 130 interrupted.
``tests/e2e/test_cli_process.py`` runs the installed command in subprocesses.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes, raw_batch_bytes

from tests.helpers import expected_batches, records
from tests.unit.conftest import Run
from zerobatch_core import (
    BatchFileReader,
    MissingDependencyError,
    __version__,
    write_batch_file,
)
from zerobatch_core.cli import EXIT_CODES, build_parser, flag_message, inspect_validate, main
from zerobatch_core.tokenization.protocol import import_optional

README = Path(__file__).resolve().parents[2] / "README.md"


def one_line_error(r: Run) -> str:
    """The single stderr line of a failed command (no traceback)."""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    return lines[0]


def text_file(path: Path, words: int = 400) -> Path:
    path.write_text(" ".join(f"word{i}" for i in range(words)))
    return path


def write_shard(path: Path, tokens: np.ndarray) -> Path:
    """A nanoGPT ``.bin`` shard (magic 20240520, version 1, uint16 tokens)."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = 20240520, 1, len(tokens)
    path.write_bytes(header.tobytes() + tokens.astype(np.uint16).tobytes())
    return path


# --- inspect and validate -----------------------------------------------------------------------


def test_inspect_text_and_json(make_file: Callable[..., Path], run: Callable[..., Run]) -> None:
    path = make_file(n=42)
    r = run("inspect", path)
    assert r.status == 0 and "num_batches" in r.out
    assert re.search(r"^dtype\s+0 \(uint32\)$", r.out, flags=re.M), r.out
    r = run("inspect", path, "--json")
    info = json.loads(r.out)
    assert info["num_batches"] == 10 and info["dropped_records"] == 2
    assert info["dtype"] == 0 and info["dtype_name"] == "uint32"


def test_validate_exit_codes(
    make_file: Callable[..., Path], tmp_path: Path, run: Callable[..., Run]
) -> None:
    good = make_file()
    r = run("validate", good, "--deep")
    assert r.status == 0 and r.out.startswith("OK ") and "10 batches" in r.out
    assert run("validate", make_file(n=4, name="one.batch")).out.count("1 batch of") == 1
    bad = tmp_path / "bad.batch"
    bad.write_bytes(good.read_bytes()[:-1])
    r = run("validate", bad)
    assert r.status == 1 and "size_mismatch" in r.out and str(bad) in r.out
    r = run("validate", bad, "--json")
    assert r.status == 1 and json.loads(r.out)["error"]["code"] == "size_mismatch"
    r = run("inspect", bad)
    assert r.status == 1 and "size_mismatch" in one_line_error(r)


def test_validate_deep_flag_reads_the_padding(
    make_file: Callable[..., Path], run: Callable[..., Run]
) -> None:
    """``--deep`` must reach ``validate_file``: one non-zero padding byte is found only with it."""
    n, seq_len, batch_size = 12, 5, 3
    assert raw_batch_bytes(batch_size, seq_len) % padded_batch_bytes(batch_size, seq_len) != 0
    path = make_file(n=n, seq_len=seq_len, batch_size=batch_size)
    data = bytearray(path.read_bytes())
    slot = HEADER_SIZE + 2 * padded_batch_bytes(batch_size, seq_len)  # batch 2
    data[slot + raw_batch_bytes(batch_size, seq_len) + 9] = 0x01
    path.write_bytes(bytes(data))

    r = run("validate", path)
    assert r.status == 0 and r.out.startswith("OK ")
    r = run("validate", path, "--json")
    assert r.status == 0 and json.loads(r.out)["deep"] is False

    r = run("validate", path, "--deep")
    assert r.status == 1 and r.out.startswith("INVALID ") and "nonzero_padding" in r.out
    assert "batch 2" in r.out
    r = run("validate", path, "--deep", "--json")
    report = json.loads(r.out)
    assert r.status == 1 and report["deep"] is True and not report["valid"]
    assert report["error"]["code"] == "nonzero_padding"


# --- usage errors and paths ---------------------------------------------------------------------


def test_argument_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["validate"],
        ["nonsense"],
        ["write", "a.npy", "b.batch"],
        ["write", "a.npy", "b.batch", "--batch-size", "0"],
        ["convert", "a.bin", "b.batch", "--seq-len", "8", "--batch-size", "2", "--seed", "-1"],
        ["convert", "a.bin", "b.batch", "--seq-len", "8", "--batch-size", "2", "--pad-id", "x"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        assert "usage: zerobatch" in capsys.readouterr().err


def test_unreadable_paths_exit_2(
    make_file: Callable[..., Path], tmp_path: Path, run: Callable[..., Run]
) -> None:
    missing = tmp_path / "missing.batch"
    np.save(tmp_path / "in.npy", records(8, 4))
    cases = [
        (["validate", missing], "missing.batch"),
        (["validate", tmp_path], str(tmp_path)),
        (["inspect", missing], "missing.batch"),
        (["write", tmp_path / "nope.npy", tmp_path / "o.batch", "--batch-size", "2"], "nope.npy"),
        (
            ["write", tmp_path / "in.npy", tmp_path / "no" / "o.batch", "--batch-size", "2"],
            "does not exist",
        ),
        (["write", tmp_path / "in.npy", tmp_path, "--batch-size", "2"], "directory"),
        (["convert", tmp_path / "nope.txt", tmp_path / "o.batch", "--seq-len", "4"], "nope.txt"),
        (["convert", tmp_path / "x*.bin", tmp_path / "o.batch", "--seq-len", "4"], "x*.bin"),
    ]
    for argv, named in cases:
        if argv[0] == "convert":
            argv += ["--batch-size", "2"]
        r = run(*argv)
        assert r.status == 2, (argv, r.err)
        assert named in one_line_error(r)
    assert not (tmp_path / "o.batch").exists()


def test_flags_replace_parameter_names_in_messages() -> None:
    args = build_parser().parse_args(
        ["convert", "x.txt", "o.batch", "--seq-len", "8", "--batch-size", "2"]
    )
    flags = args.option_flags
    cases = {
        "pad_id applies only to mode='pad'; 'pack' never pads": (
            "--pad-id applies only to --mode pad; 'pack' never pads"
        ),
        "align='bos' needs bos_token, the token id": "--align bos needs --bos-token, the token id",
        "seed must be in [0, 2**32 - 1], got 5": "--seed must be in [0, 2**32 - 1], got 5",
        "a: expected [num_records, 4] for seq_len=4": (
            "a: expected [num_records, 4] for --seq-len 4"
        ),
        "o: exists; pass overwrite=True (--overwrite on the command line) to replace it": (
            "o: exists; pass --overwrite to replace it"
        ),
        "tokenizer spec 'hf:t.json?pad_id=3': unknown option": (
            "--tokenizer 'hf:t.json?pad_id=3': unknown option"  # the quoted value is the user's
        ),
        "fewer than batch_size=8; pass allow_empty=True": (
            "fewer than --batch-size 8; pass --allow-empty"
        ),
    }
    for message, expected in cases.items():
        assert flag_message(message, flags) == (expected, True)
    # Shapes, quoted values, paths and plain words are left alone.
    for message in (
        "a.npy: expected [num_records, seq_len] or [num_tokens]",
        "data/pad_id/a.txt: no such file",
        "the seed and the mode are fine",
        "overwrite=False",
    ):
        assert flag_message(message, flags) == (message, False)


def test_api_errors_name_flags_and_are_usage_errors(
    tmp_path: Path, run: Callable[..., Run]
) -> None:
    doc = text_file(tmp_path / "doc.txt")
    shard = write_shard(tmp_path / "s.bin", np.arange(100))
    out = tmp_path / "o.batch"
    shape = ["--seq-len", "8", "--batch-size", "2"]
    cases = [
        (["convert", doc, out, *shape, "--mode", "pad"], ["--mode pad", "--pad-id"]),
        (["convert", doc, out, *shape, "--pad-id", "3"], ["--pad-id", "--mode pad"]),
        (["convert", shard, out, *shape, "--align", "bos"], ["--align bos", "--bos-token"]),
        (["convert", doc, out, *shape, "--tokenizer", "foo"], ["--tokenizer 'foo'"]),
        (["convert", doc, out, *shape, "--tokenizer", "hf:t.json"], ["--tokenizer 'hf:t.json'"]),
    ]
    for argv, flags in cases:
        r = run(*argv)
        line = one_line_error(r)
        assert r.status == 2, (argv, line)
        assert all(flag in line for flag in flags), line
        assert not re.search(r"\b(pad_id|bos_token|mode=|align=|tokenizer spec)", line), line
    assert not out.exists()


# --- write --------------------------------------------------------------------------------------


def test_write_from_npy(tmp_path: Path, run: Callable[..., Run]) -> None:
    src = records(50, 6)
    np.save(tmp_path / "in.npy", src)
    out = tmp_path / "out.batch"
    r = run("write", tmp_path / "in.npy", out, "--batch-size", 8, "--seed", 3)
    assert r.status == 0 and "6 batches" in r.out and r.err == ""
    with BatchFileReader(out) as reader:
        np.testing.assert_array_equal(reader.read_batches(0, 6), expected_batches(src, 8, 3))
    write_batch_file(tmp_path / "api.batch", src, batch_size=8, seed=3, dtype="auto")
    assert out.read_bytes() == (tmp_path / "api.batch").read_bytes()


def test_write_points_flat_arrays_to_convert(tmp_path: Path, run: Callable[..., Run]) -> None:
    np.save(tmp_path / "flat.npy", np.arange(1000, dtype=np.uint16))
    r = run("write", tmp_path / "flat.npy", tmp_path / "o.batch", "--batch-size", 4)
    line = one_line_error(r)
    assert r.status == 2 and "[records, seq_len]" in line
    assert f"zerobatch convert {tmp_path / 'flat.npy'} {tmp_path / 'o.batch'} --seq-len T" in line
    assert not (tmp_path / "o.batch").exists()


def test_write_checks_seq_len_against_the_array(tmp_path: Path, run: Callable[..., Run]) -> None:
    np.save(tmp_path / "in.npy", records(8, 4))
    r = run("write", tmp_path / "in.npy", tmp_path / "o.batch", "--batch-size", 2, "--seq-len", 5)
    line = one_line_error(r)
    assert r.status == 2 and "--seq-len 5" in line and "4 tokens" in line
    r = run("write", tmp_path / "in.npy", tmp_path / "o.batch", "--batch-size", 2, "--seq-len", 4)
    assert r.status == 0


def test_write_rejects_bad_input(tmp_path: Path, run: Callable[..., Run]) -> None:
    out = tmp_path / "o.batch"
    np.save(tmp_path / "f.npy", np.zeros((4, 4), dtype=np.float64))
    r = run("write", tmp_path / "f.npy", out, "--batch-size", 2)
    assert r.status == 1 and "integer dtype" in one_line_error(r)
    np.save(tmp_path / "big.npy", np.full((4, 4), 2**40, dtype=np.int64))
    r = run("write", tmp_path / "big.npy", out, "--batch-size", 2)
    assert r.status == 1 and "uint32 range" in one_line_error(r)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    r = run("write", tmp_path / "junk.npy", out, "--batch-size", 2)
    assert r.status == 2 and "junk.npy" in one_line_error(r)
    np.save(tmp_path / "obj.npy", np.array([object()], dtype=object), allow_pickle=True)
    r = run("write", tmp_path / "obj.npy", out, "--batch-size", 2)
    assert r.status == 2 and "obj.npy" in one_line_error(r)  # never unpickles
    assert not out.exists()


# --- what write and convert may write -----------------------------------------------------------


def write_and_convert(tmp_path: Path, out: Path, *extra: object) -> list[list[object]]:
    """A ``write`` and a ``convert`` command line into ``out``, from 10 records of 4 tokens."""
    np.save(tmp_path / "in.npy", records(10, 4))
    return [
        ["write", tmp_path / "in.npy", out, "--batch-size", 2, *extra],
        ["convert", tmp_path / "in.npy", out, "--seq-len", 4, "--batch-size", 2, *extra],
    ]


def test_existing_output_needs_overwrite(tmp_path: Path, run: Callable[..., Run]) -> None:
    out = tmp_path / "o.batch"
    for argv in write_and_convert(tmp_path, out):
        out.write_bytes(b"precious")
        r = run(*argv)
        line = one_line_error(r)
        assert r.status == 2 and str(out) in line and "--overwrite" in line
        assert out.read_bytes() == b"precious"
        r = run(*argv, "--overwrite")
        assert r.status == 0, r.err
        with BatchFileReader(out) as reader:
            assert reader.num_batches == 5


def test_output_that_is_an_input_is_refused(tmp_path: Path, run: Callable[..., Run]) -> None:
    np.save(tmp_path / "a.npy", records(10, 4))
    doc = text_file(tmp_path / "x.txt")
    before = (tmp_path / "a.npy").read_bytes(), doc.read_bytes()
    for argv in (
        ["write", tmp_path / "a.npy", tmp_path / "a.npy", "--batch-size", 2],
        ["convert", tmp_path / "a.npy", tmp_path / "a.npy", "--seq-len", 4, "--batch-size", 2],
        ["convert", doc, doc, "--seq-len", 4, "--batch-size", 2],
    ):
        for extra in ([], ["--overwrite"]):
            r = run(*argv, *extra)
            assert r.status == 2 and str(argv[1]) in one_line_error(r)
    assert ((tmp_path / "a.npy").read_bytes(), doc.read_bytes()) == before


def test_empty_output_needs_allow_empty(tmp_path: Path, run: Callable[..., Run]) -> None:
    out = tmp_path / "o.batch"
    for argv in write_and_convert(tmp_path, out, "--batch-size", 16):
        r = run(*argv)
        line = one_line_error(r)
        assert r.status == 2 and "--allow-empty" in line and "--batch-size" in line, line
        assert "allow_empty" not in line and "batch_size" not in line
        assert not out.exists()
        r = run(*argv, "--allow-empty", "--json")
        assert r.status == 0, r.err
        assert json.loads(r.out)["batches"] == 0
        with BatchFileReader(out) as reader:
            assert reader.num_batches == 0
        out.unlink()


def test_quiet_json_and_progress(
    tmp_path: Path, run: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = tmp_path / "o.batch"
    for argv in write_and_convert(tmp_path, out, "--overwrite"):
        r = run(*argv)  # captured stderr is no terminal: no progress display
        assert r.status == 0 and r.err == "" and "wrote" in r.out
        r = run(*argv, "--quiet")
        assert (r.status, r.out, r.err) == (0, "", "")
        r = run(*argv, "--json", "--quiet")
        assert r.status == 0 and json.loads(r.out)["batches"] == 5 and r.err == ""

        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main([str(a) for a in argv]) == 0
        assert "10/10 records" in terminal.getvalue() and terminal.getvalue().endswith("\n")
        quiet = Terminal()
        monkeypatch.setattr(sys, "stderr", quiet)
        assert main([str(a) for a in [*argv, "--quiet"]]) == 0
        assert quiet.getvalue() == ""
        monkeypatch.undo()


def test_summary_counts_written_records_and_pluralises(
    tmp_path: Path, run: Callable[..., Run]
) -> None:
    np.save(tmp_path / "three.npy", records(3, 4))  # 1 batch of 2, 1 record dropped
    np.save(tmp_path / "five.npy", records(5, 4))  # 2 batches of 2, 1 record dropped
    r = run("write", tmp_path / "three.npy", tmp_path / "a.batch", "--batch-size", 2)
    assert r.status == 0
    assert re.search(r"\b1 batch\b(?!es)", r.out) and re.search(r"\b2 records\b", r.out), r.out
    assert "dropped" in r.out and re.search(r"\b1 record\b(?!s)", r.out), r.out
    assert re.search(r"\b4 tokens\b", r.out), r.out  # the dropped record's tokens
    r = run("write", tmp_path / "five.npy", tmp_path / "b.batch", "--batch-size", 2, "--json")
    summary = json.loads(r.out)
    assert summary["batches"] == 2 and summary["records"] == 4
    assert summary["dropped_records"] == 1
    r = run("write", tmp_path / "five.npy", tmp_path / "c.batch", "--batch-size", 2)
    assert re.search(r"\b2 batches\b", r.out), r.out


# --- errors that are not the data's fault -------------------------------------------------------


def test_missing_dependency_exits_3(
    tmp_path: Path, run: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes ``import pyarrow`` fail, as it does where it is not installed.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MissingDependencyError) as info:
        import_optional("pyarrow.parquet", "reading parquet")
    assert isinstance(info.value, ImportError) and info.value.extra == "text"
    assert info.value.name == "pyarrow"
    source = tmp_path / "docs.parquet"
    source.write_bytes(b"PAR1")
    r = run("convert", source, tmp_path / "o.batch", "--seq-len", 8, "--batch-size", 2)
    line = one_line_error(r)
    assert r.status == 3 and "pyarrow" in line and "pip install 'zerobatch[text]'" in line


def test_unexpected_errors_exit_70_and_debug_shows_tracebacks(
    make_file: Callable[..., Path], run: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_file()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(inspect_validate, "validate_file", broken)
    r = run("validate", path)
    line = one_line_error(r)
    assert r.status == 70 and "RuntimeError: a bug" in line and "--debug" in line
    for argv in (["--debug", "validate", path], ["validate", path, "--debug"]):
        r = run(*argv)
        assert r.status == 70 and "Traceback" in r.err and "RuntimeError: a bug" in r.err

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_validate, "validate_file", interrupted)
    r = run("validate", path)
    assert r.status == 130 and "interrupted" in one_line_error(r)


def test_zerobatch_errors_show_a_traceback_only_with_debug(
    tmp_path: Path, run: Callable[..., Run]
) -> None:
    np.save(tmp_path / "f.npy", np.zeros((4, 4), dtype=np.float64))
    argv = ["write", tmp_path / "f.npy", tmp_path / "o.batch", "--batch-size", 2]
    r = run(*argv)
    assert r.status == 1 and "integer dtype" in one_line_error(r)
    r = run("--debug", *argv)
    assert r.status == 1 and "Traceback" in r.err and "IngestError" in r.err
    r = run("validate", tmp_path / "missing.batch", "--debug")
    assert r.status == 2 and "FileNotFoundError" in r.err


def test_demo_refuses_fewer_records_than_a_batch(tmp_path: Path, run: Callable[..., Run]) -> None:
    r = run("demo", "--out", tmp_path, "--records", 4, "--batch-size", 8)
    line = one_line_error(r)
    assert r.status == 2 and "--records 4" in line and "--batch-size 8" in line


# --- help, version and documentation ------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    assert action.choices is not None
    return dict(action.choices)


def help_entries(text: str) -> dict[str, str]:
    """Each option's help entry in ``--help`` output, by its long flag, lines joined."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in text.splitlines():
        if re.match(r"^  (-\w, )?(--[\w-]+)", line):
            # every long flag of the option (aliases: "--kind KIND, --format KIND")
            current = re.findall(r"(?:^|, )(--[\w-]+)", line.strip().split("  ")[0])
            for flag in current:
                entries[flag] = line
        elif current and line.startswith("    "):
            for flag in current:
                entries[flag] += " " + line.strip()
        else:
            current = []
    return entries


def test_help_of_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    commands = subcommands()
    assert {"inspect", "validate", "write", "convert", "demo", "conformance", "probe"} <= set(
        commands
    )
    for name in ["", *commands]:
        argv = [name, "--help"] if name else ["--help"]
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
        text = capsys.readouterr().out
        assert "``" not in text, name
        assert text.startswith(f"usage: zerobatch {name}".rstrip()), name
        if not name:
            continue
        parser = commands[name]
        entries = help_entries(text)
        assert "examples:" in text or "example:" in text, name
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            flag = action.option_strings[-1]
            entry = entries[flag]
            assert action.help and len(entry.split()) > 2, (name, flag)
            if action.required:
                assert "required" in entry, (name, flag, entry)
            elif action.default is not False and action.default is not argparse.SUPPRESS:
                assert "default" in entry, (name, flag, entry)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"zerobatch {__version__}\n"


def test_exit_codes_and_commands_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    readme = README.read_text()
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    for code, meaning in EXIT_CODES:
        assert re.search(rf"^\s+{code}  {re.escape(meaning.split()[0])}", text, flags=re.M)
        assert re.search(rf"^\| {code} \|", section, flags=re.M), code
    for name in subcommands():
        assert f"zerobatch {name}" in section, name
    assert "--debug" in section and "--version" in section


# --- datasets: --shard-size, dataset create, inspect, validate and trace -----------------------


def test_write_and_convert_shard_size_write_a_dataset(
    tmp_path: Path, run: Callable[..., Run]
) -> None:
    np.save(tmp_path / "in.npy", records(50, 6))
    out = tmp_path / "ds"
    r = run("write", tmp_path / "in.npy", out, "--batch-size", 4, "--shard-size", 3, "--json")
    summary = json.loads(r.out)
    assert r.status == 0 and summary["shards"] == 5 and summary["batches"] == 12
    assert (out / "manifest.json").is_file() and len(list(out.glob("shard-*.batch"))) == 5
    r = run("write", tmp_path / "in.npy", out, "--batch-size", 4, "--shard-size", 3)
    line = one_line_error(r)
    assert r.status == 2 and "already a dataset" in line and "--overwrite" in line
    r = run(
        "convert", tmp_path / "in.npy", out, "--seq-len", 6, "--batch-size", 4, "--shard-size",
        100, "--overwrite",
    )  # fmt: skip
    assert r.status == 0 and "wrote" in r.out and "1 shard," in r.out, r.out
    assert sorted(p.name for p in out.glob("*.batch")) == ["shard-00000.batch"]
    with pytest.raises(SystemExit) as exited:  # argparse's own usage error
        run("write", tmp_path / "in.npy", tmp_path / "f", "--batch-size", 4, "--shard-size", 0)
    assert exited.value.code == 2
    (tmp_path / "file").write_bytes(b"x")
    r = run("write", tmp_path / "in.npy", tmp_path / "file", "--batch-size", 4, "--shard-size", 2)
    assert r.status == 2 and "not a directory" in one_line_error(r)


def test_dataset_create_inspect_and_trace(tmp_path: Path, run: Callable[..., Run]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        write_batch_file(data / f"p{i}.batch", records(16, 6) + 100 * i, batch_size=4, seed=i)
    r = run("dataset", "create", data, data / "p2.batch", "p0.batch", "--seed", 9, "--json")
    assert r.status == 0, r.err
    assert json.loads(r.out)["shards"] == 2 and json.loads(r.out)["num_batches"] == 8
    r = run("dataset", "create", data)
    assert r.status == 2 and "--overwrite" in one_line_error(r)
    r = run("dataset", "create", data, "--overwrite")
    assert r.status == 0 and "3 shards, 12 batches of [4, 6], seed 0" in r.out
    r = run("dataset", "create", data, tmp_path / "elsewhere.batch", "--overwrite")
    assert r.status == 2 and "not in" in one_line_error(r)
    r = run("dataset", "create", tmp_path / "missing")
    assert r.status == 2 and "no such directory" in one_line_error(r)
    write_batch_file(data / "odd.batch", records(8, 5), batch_size=4)
    r = run("dataset", "create", data, "--overwrite")
    assert r.status == 1 and "odd.batch" in one_line_error(r)
    (data / "odd.batch").unlink()

    r = run("inspect", data)
    assert r.status == 0 and re.search(r"^shards\s+3$", r.out, flags=re.M), r.out
    assert re.search(r"^checksum_algorithm\s+xxh3-64$", r.out, flags=re.M)
    info = json.loads(run("inspect", data, "--json").out)
    assert (info["num_batches"], info["batch_size"], info["seq_len"], info["seed"]) == (
        12,
        4,
        6,
        0,
    )
    assert [s["name"] for s in info["shard_list"]] == ["p0.batch", "p1.batch", "p2.batch"]
    assert info["size"] == sum((data / f"p{i}.batch").stat().st_size for i in range(3))

    r = run("trace", data, "--step", 5, "--rank", 1, "--of", 2, "--json")
    trace = json.loads(r.out)
    assert r.status == 0 and trace["step"] == 5 and trace["world_size"] == 2
    (piece,) = trace["pieces"]
    assert piece["rows"] == [2, 4] and piece["shard"] in {"p0.batch", "p1.batch", "p2.batch"}
    r = run("trace", data, "--step", 5)
    assert r.status == 0 and "rows [0, 4):" in r.out and "row 3: shard record" in r.out
    r = run("trace", data, "--step", 12)
    assert r.status == 2 and "--step must be in [0, 12)" in one_line_error(r)
    r = run("trace", data, "--step", 0, "--of", 3)
    assert r.status == 2 and "--of 3" in one_line_error(r)
    r = run("trace", data, "--step", 0, "--context-size", 4)
    assert r.status == 2 and "--context-size" in one_line_error(r)

    (data / "manifest.json").write_text("{}")
    for argv in (["inspect", data], ["trace", data, "--step", 0]):
        r = run(*argv)
        assert r.status == 1 and "manifest_bad_format" in one_line_error(r)
