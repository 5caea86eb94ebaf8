"""Atlas datasets: every compression strategy, every kind of example, and hostile inputs.

Datasets are written here by ``tests/atlas_writer.py`` as the format's description says
(pickled lists per block, zstd with trained dictionaries, ``index.npy`` in the smallest
unsigned dtype). Streams, document starts and records are checked against what the examples
hold, computed here straight from the Python objects written, and a plain NumPy cut of that
stream. Corrupt and hostile inputs must each give one ``IngestError`` naming the file and the
rule broken; a pickle that would run code must be refused without running it.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import zstandard

from tests.atlas_writer import (
    compressor,
    pickled_blocks,
    rewrite_blocks,
    stored_blocks,
    write_dataset,
    write_index,
    write_shard,
)
from zerobatch_core.errors import IngestError, MissingDependencyError, ZeroBatchError
from zerobatch_core.ingest import atlas
from zerobatch_core.ingest.atlas import (
    AtlasShard,
    expand_atlas,
    is_atlas,
    restricted_loads,
    shard_folders,
)
from zerobatch_core.ingest.token_files import TokenFile, TokenFileSource

STRATEGIES = (0, 1, 2, 3)
ARRAY_DTYPES = (np.uint8, np.uint16, np.int32, np.int64, np.uint32, np.uint64, ">u2", "<i2")
"""Integer dtypes examples are stored as (native and explicit byte orders)."""


# --- expected streams, from the Python objects written -----------------------------------------


def tokens_of(example: Any, field: str = "input_ids") -> list[int]:
    """The tokens of an example as the test wrote it."""
    if isinstance(example, dict):
        example = example[field]
    return [int(v) for v in example]


def expected_stream(examples: Sequence[Any]) -> tuple[npt.NDArray[np.uint32], list[int]]:
    """The stream and document starts of a shard's examples."""
    stream: list[int] = []
    starts: list[int] = []
    for ex in examples:
        starts.append(len(stream))
        stream.extend(tokens_of(ex))
    return np.array(stream, dtype=np.uint32), starts


def document_records(
    stream: npt.NDArray[np.uint32], starts: Sequence[int], t: int
) -> list[npt.NDArray[np.uint32]]:
    """Records of ``t`` tokens cut at document starts (the ``documents`` layout), by a loop."""
    out: list[npt.NDArray[np.uint32]] = []
    pos = 0
    for s in sorted(set(starts)):
        if s < pos or s >= stream.size:
            continue
        if s + t > stream.size:
            break
        out.append(stream[s : s + t])
        pos = s + t
    return out


def contiguous_records(stream: npt.NDArray[np.uint32], t: int) -> list[npt.NDArray[np.uint32]]:
    n = stream.size // t
    return list(stream[: n * t].reshape(n, t))


def source_records(files: Sequence[TokenFile], t: int, layout: Any) -> list[list[int]]:
    src = TokenFileSource(files, t, layout, chunk_records=3)
    rows = [row.tolist() for block in src.iter_blocks() for row in block]
    assert len(rows) == src.num_records
    return rows


def mixed_examples(rng: np.random.Generator, n: int, salt: int = 0) -> list[Any]:
    """``n`` examples of every kind: int lists, arrays of several dtypes, dicts, empties."""
    out: list[Any] = []
    for i in range(n):
        length = 0 if (i + salt) % 5 == 3 else int(rng.integers(1, 14))
        values = rng.integers(0, 250, length)
        kind = (i + salt) % 4
        if kind == 0:
            out.append([int(v) for v in values])
        elif kind == 1:
            dt = ARRAY_DTYPES[(i // 4 + salt) % len(ARRAY_DTYPES)]
            out.append(np.asarray(values).astype(dt))
        elif kind == 2:
            out.append({"input_ids": [int(v) for v in values], "id": f"doc-{i}"})
        else:
            out.append(np.asarray(values, dtype=np.uint16) + 60000)
    return out


def check_shards(
    shards: Sequence[AtlasShard], examples: Sequence[Sequence[Any]], seed: int = 0
) -> None:
    """Every shard's stream, ranges, starts and records against the examples written."""
    rng = np.random.default_rng(seed)
    assert len(shards) == len(examples)
    streams = []
    for shard, exs in zip(shards, examples, strict=True):
        stream, starts = expected_stream(exs)
        streams.append((stream, starts))
        assert isinstance(shard, TokenFile)
        assert shard.num_tokens == stream.size
        assert shard.dtype == np.uint32
        assert shard.document_starts().tolist() == starts
        got = shard.read_tokens(0, stream.size)
        assert got.dtype == np.uint32 and np.array_equal(got, stream)
        cuts = np.sort(rng.integers(0, stream.size + 1, 8))
        for lo, hi in itertools.pairwise(cuts):  # ascending sub-ranges
            assert np.array_equal(shard.read_tokens(int(lo), int(hi)), stream[lo:hi])
    for t in (1, 3, 7):
        want = [r.tolist() for s, _ in streams for r in contiguous_records(s, t)]
        assert source_records(shards, t, "contiguous") == want
        want = [r.tolist() for s, st in streams for r in document_records(s, st, t)]
        assert source_records(shards, t, "documents") == want


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def make_dataset(
    tmp_path: Path, strategy: int, rng: np.random.Generator, **kw: Any
) -> tuple[str, list[list[Any]]]:
    """Three shards (23, 21 and 9 examples), block size 3: short last blocks, >= 7 blocks in
    the first two shards (dictionaries are trained), the third below that (falls back)."""
    examples = [mixed_examples(rng, n, salt=k) for k, n in enumerate((23, 21, 9))]
    root = str(tmp_path / f"ds{strategy}")
    write_dataset(root, examples, 3, strategy, **kw)
    return root, examples


# --- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_reads_back_what_was_written(
    tmp_path: Path, rng: np.random.Generator, strategy: int
) -> None:
    root, examples = make_dataset(tmp_path, strategy, rng)
    metas = [json.loads(Path(f, "meta.json").read_text()) for f in shard_folders(root)]
    used = [m["compression_strategy"] for m in metas]
    if strategy == 3:
        assert used == [3, 3, 1]  # the 3-block shard cannot train a dictionary
        assert all(Path(f, "zstd_dict.bin").exists() for f in shard_folders(root)[:2])
    else:
        assert used == [strategy] * 3
    if strategy == 2:
        assert Path(root, "zstd_dict.bin").exists()
    shards = expand_atlas(root)
    assert [s.strategy for s in shards] == used
    check_shards(shards, examples)


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_every_pickle_protocol_of_arrays_scalars_and_lists(
    tmp_path: Path, rng: np.random.Generator, protocol: int
) -> None:
    """NumPy pickles arrays with ``_reconstruct`` (protocols 0-4; ``_codecs.encode`` and
    ``bytes()`` for their bytes in 0-2) or ``_frombuffer`` (5), and scalars with ``scalar``:
    all decode to the same tokens."""
    examples = mixed_examples(rng, 20)
    examples[4] = [np.int64(7), np.uint16(65535), 3, np.uint32(2**32 - 1)]
    examples[5] = np.arange(10, dtype=np.int64)[::3]  # not contiguous
    examples[6] = tuple(range(5))
    root = str(tmp_path / "ds")
    write_dataset(root, [examples], 6, 1, protocol=protocol)
    check_shards(expand_atlas(root), [examples])


def test_empty_examples_blocks_and_shards(tmp_path: Path) -> None:
    shards = [[[], [], np.zeros(0, np.uint8), [5], []], [], [[], []]]
    root = str(tmp_path / "ds")
    folders = write_dataset(root, shards, 2, 1)
    assert not Path(folders[1], "data.bin").exists()  # the reference writer writes none
    opened = expand_atlas(root)
    assert [s.num_tokens for s in opened] == [1, 0, 0]
    assert opened[0].document_starts().tolist() == [0, 0, 0, 0, 1]
    assert opened[1].document_starts().tolist() == []
    assert opened[2].read_tokens(0, 0).size == 0
    check_shards(opened, shards)


def test_reading_in_ascending_ranges_decodes_each_block_once(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = mixed_examples(rng, 40)
    root = str(tmp_path / "ds")
    write_dataset(root, [examples], 4, 3)
    (shard,) = expand_atlas(root)
    decoded: list[int] = []
    real = AtlasShard._decode

    def counting(self: AtlasShard, b: int) -> Any:
        decoded.append(b)
        return real(self, b)

    monkeypatch.setattr(AtlasShard, "_decode", counting)
    n = shard.num_tokens  # the counting pass: each block once
    assert decoded == list(range(10))
    decoded.clear()
    stream, _ = expected_stream(examples)
    parts = [shard.read_tokens(lo, min(lo + 5, n)) for lo in range(0, n, 5)]
    assert np.array_equal(np.concatenate(parts), stream)
    nonempty = [b for b in range(10) if any(len(tokens_of(e)) for e in examples[4 * b : 4 * b + 4])]
    assert decoded == nonempty  # in order, once each, empty blocks skipped


def test_shards_of_one_dataset_hold_one_decoded_block(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    root, _ = make_dataset(tmp_path, 3, rng)
    a, b, c = expand_atlas(root)
    a.read_tokens(0, 5)
    b.read_tokens(0, 5)
    slot = a._slot
    assert slot is b._slot is c._slot and slot.owner is b
    b.close()
    assert slot.owner is None and slot.tokens.size == 0


def test_datasets_shard_folders_and_patterns(tmp_path: Path, rng: np.random.Generator) -> None:
    examples = [mixed_examples(rng, 2, salt=k) for k in range(12)]
    root = str(tmp_path / "plain")
    write_dataset(root, examples, 2, 0, pad=False)  # 0, 1, ..., 10, 11: numeric order
    names = [os.path.basename(s.path) for s in expand_atlas(root)]
    assert names == [str(i) for i in range(12)]
    check_shards(expand_atlas(root), examples)
    padded = str(tmp_path / "padded")
    write_dataset(padded, examples, 2, 1)
    assert [os.path.basename(f) for f in shard_folders(padded)] == [f"{i:02d}" for i in range(12)]
    # A shard folder alone, a glob of shard folders, and a dataset with a folder given twice.
    one = expand_atlas(os.path.join(root, "10"))
    check_shards(one, [examples[10]])
    globbed = expand_atlas(os.path.join(root, "1?"))
    assert [os.path.basename(s.path) for s in globbed] == ["10", "11"]
    with pytest.raises(IngestError, match="listed twice"):
        expand_atlas([root, os.path.join(root, "3")])
    with pytest.raises(IngestError, match="no Atlas input matches"):
        expand_atlas(str(tmp_path / "nothing*"))


def test_shard_of_a_shared_dictionary_dataset_opened_alone(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    root, examples = make_dataset(tmp_path, 2, rng)
    folder = shard_folders(root)[1]
    check_shards(expand_atlas(folder + os.sep), [examples[1]])


def test_is_atlas_tells_datasets_and_shards_from_other_directories(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    root, _ = make_dataset(tmp_path, 0, rng)
    assert is_atlas(root) and is_atlas(shard_folders(root)[0])
    assert not is_atlas(tmp_path)
    assert not is_atlas(os.path.join(root, "meta.json"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "meta.json").write_text('{"version": 1}')
    assert not is_atlas(other)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "meta.json")
    assert not is_atlas(fifo)  # refused without blocking


def test_dict_examples_with_another_field_or_none(tmp_path: Path) -> None:
    examples = [{"tokens": [1, 2]}, {"tokens": np.array([3], np.int8)}, [4, 5]]
    root = str(tmp_path / "ds")
    write_dataset(root, [examples], 2, 0)
    (shard,) = expand_atlas(root, field="tokens")
    assert shard.read_tokens(0, 5).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(
        IngestError, match=r"example 0 \(example 0 of the shard\) is a dict without"
    ):
        assert expand_atlas(root)[0].num_tokens
    with pytest.raises(IngestError, match="no field was given"):
        assert expand_atlas(root, field=None)[0].num_tokens


def test_missing_zstandard_names_the_formats_extra(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = make_dataset(tmp_path, 1, rng)

    def missing(module: str, what: str) -> Any:
        raise MissingDependencyError(module, "text", what)

    monkeypatch.setattr(atlas, "import_optional", missing)
    with pytest.raises(MissingDependencyError) as e:
        expand_atlas(root)
    assert e.value.extra == "formats" and "zstandard" in str(e.value)


# --- corrupt inputs -----------------------------------------------------------------------------


def one_error(fn: Any) -> IngestError:
    """The ``IngestError`` that opening and reading everything raises."""
    with pytest.raises(IngestError) as e:
        for shard in fn():
            shard.read_tokens(0, shard.num_tokens)
            shard.document_starts()
    return e.value


def small_dataset(tmp_path: Path, strategy: int, n: int = 20, block_size: int = 2) -> str:
    rng = np.random.default_rng(strategy)
    root = str(tmp_path / f"ds{strategy}")
    write_dataset(root, [mixed_examples(rng, n), mixed_examples(rng, 3)], block_size, strategy)
    return root


def test_index_not_monotonic_names_the_entry(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    folder = shard_folders(root)[0]
    offsets = np.load(os.path.join(folder, "index.npy")).astype(np.int64)
    offsets[4], offsets[5] = offsets[5], offsets[4]
    write_index(os.path.join(folder, "index.npy"), offsets.tolist())
    e = one_error(lambda: expand_atlas(root))
    assert "index.npy: entry 5 is" in str(e) and "must not decrease" in str(e)


def test_last_offset_must_be_data_size(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 1)
    folder = shard_folders(root)[0]
    offsets = np.load(os.path.join(folder, "index.npy")).astype(np.int64)
    data = os.path.join(folder, "data.bin")
    for delta, state in ((1, "truncated data.bin"), (-1, "trailing bytes in data.bin")):
        changed = offsets.copy()
        changed[-1] += delta
        write_index(os.path.join(folder, "index.npy"), changed.tolist())
        e = str(one_error(lambda: expand_atlas(root)))
        assert f"{data}: {offsets[-1]:,} bytes, but the last entry of" in e
        assert f"index.npy (entry 10) says {offsets[-1] + delta:,} ({state})" in e


def test_truncated_data_bin(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    data = Path(shard_folders(root)[0], "data.bin")
    data.write_bytes(data.read_bytes()[:-3])
    e = str(one_error(lambda: expand_atlas(root)))
    assert str(data) in e and "truncated data.bin" in e


def test_index_header_dtype_and_length_are_checked(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    index = os.path.join(shard_folders(root)[0], "index.npy")
    offsets = np.load(index)
    np.save(index, offsets.astype(np.int64))
    assert "expected an unsigned integer" in str(one_error(lambda: expand_atlas(root)))
    np.save(index, offsets[:-1])
    assert "entries, expected 11" in str(one_error(lambda: expand_atlas(root)))
    np.save(index, offsets.reshape(1, -1))
    assert "expected 1-D" in str(one_error(lambda: expand_atlas(root)))
    Path(index).write_bytes(b"\x93NUMPY\x01\x00\xff\x00{'descr': ")
    assert "not a NumPy .npy file" in str(one_error(lambda: expand_atlas(root)))
    np.save(index, offsets)
    with open(index, "ab") as f:
        f.write(b"\x00")
    assert "trailing bytes" in str(one_error(lambda: expand_atlas(root)))


def test_zstd_frame_cut_short(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 1)
    folder = shard_folders(root)[0]
    blocks = stored_blocks(folder)
    blocks[3] = blocks[3][:-4]  # the index agrees: only the frame is short
    rewrite_blocks(folder, blocks)
    e = str(one_error(lambda: expand_atlas(root)))
    assert "data.bin: block 3" in e and "cut short" in e


def test_bytes_after_a_frame_or_a_pickle(tmp_path: Path) -> None:
    for strategy, extra in ((1, "follow the zstd frame"), (0, "follow the end of the pickle")):
        root = small_dataset(tmp_path, strategy)
        folder = shard_folders(root)[0]
        blocks = stored_blocks(folder)
        blocks[2] += b"\x00\x00"
        rewrite_blocks(folder, blocks)
        e = str(one_error(lambda root=root: expand_atlas(root)))
        assert "block 2" in e and extra in e


@pytest.mark.parametrize("strategy", [2, 3])
def test_missing_dictionary(tmp_path: Path, strategy: int) -> None:
    root = small_dataset(tmp_path, strategy)
    where = root if strategy == 2 else shard_folders(root)[0]
    os.remove(os.path.join(where, "zstd_dict.bin"))
    e = str(one_error(lambda: expand_atlas(root)))
    assert os.path.join(where, "zstd_dict.bin") in e and "is missing" in e


def test_wrong_dictionary(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 3)
    one, _ = shard_folders(root)
    other = str(tmp_path / "other")
    write_shard(other, [[i] * 9 for i in range(30)], 2, 3)
    os.replace(os.path.join(other, "zstd_dict.bin"), os.path.join(one, "zstd_dict.bin"))
    e = str(one_error(lambda: expand_atlas(root)))
    assert "block 0" in e and "needs dictionary" in e


def evil_payloads(marker: Path) -> list[tuple[bytes, str]]:
    """Pickles that would create ``marker`` if loaded, and the global each must be refused
    for."""
    cmd = f"touch {marker}"

    class System:
        def __reduce__(self) -> Any:
            return (os.system, (cmd,))

    class Eval:
        def __reduce__(self) -> Any:
            return (eval, (f"__import__('os').system({cmd!r})",))

    class Popen:
        def __reduce__(self) -> Any:
            return (subprocess.Popen, (["touch", str(marker)],))

    getattr_chain = (
        b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR(S'"
        + cmd.encode()
        + b"'\ntR."
    )
    system = f"{os.system.__module__}.system"
    return [
        (pickle.dumps([System()]), system),
        (pickle.dumps([Eval()], protocol=2), "__builtin__.eval"),  # Python 2 names, as given
        (pickle.dumps([Popen()], protocol=5), "subprocess.Popen"),
        (getattr_chain, "builtins.getattr"),
    ]


@pytest.mark.parametrize("strategy", [0, 1])
def test_a_pickle_that_would_run_code_is_refused_without_running_it(
    tmp_path: Path, strategy: int
) -> None:
    marker = tmp_path / "pwned"
    root = small_dataset(tmp_path, strategy)
    folder = shard_folders(root)[0]
    cctx = compressor(folder, strategy)
    for payload, name in evil_payloads(marker):
        blocks = stored_blocks(folder)
        blocks[1] = payload if cctx is None else cctx.compress(payload)
        rewrite_blocks(folder, blocks)
        e = str(one_error(lambda: expand_atlas(root)))
        assert not marker.exists(), "the pickle ran"
        assert os.path.join(folder, "data.bin") in e and "block 1" in e
        assert f"references the global {name}," in e and "not allowed" in e


def test_restricted_loads_refuses_persistent_ids_and_other_globals(tmp_path: Path) -> None:
    persid = b"\x80\x02]q\x00(P1\nq\x01e."
    with pytest.raises(atlas.PickleRefusedError, match="opcode PERSID at offset 6 is not"):
        restricted_loads(persid)  # refused by the scan
    with pytest.raises(atlas.PickleRefusedError, match="persistent id"):
        atlas.RestrictedUnpickler(io.BytesIO(persid)).load()  # and by the unpickler
    for obj, name in (
        (np.float32(1.5), "numpy._core.multiarray.scalar"),  # allowed global, float dtype
        (Path("x"), "pathlib"),
        ({1, 2}, None),  # a set needs no global: plain data, refused later as an example
    ):
        if name is None:
            assert restricted_loads(pickle.dumps(obj)) == obj
            continue
        with pytest.raises(atlas.PickleRefusedError, match=r"not allowed|only integer dtypes"):
            restricted_loads(pickle.dumps(obj))
    # BUILD on an allowed global's stand-in is refused (no attribute a pickle could reach).
    with pytest.raises(atlas.PickleRefusedError, match="sets the state"):
        restricted_loads(b"\x80\x02cnumpy\ndtype\n}b.")


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ({"a": [1]}, "decodes to a dict, expected a list of examples"),
        ((1, 2), "decodes to a tuple, expected a list"),
        ([[1, 2.5]], r"example 0 \(example 2 of the shard\) token 1 is a float \(2.5\)"),
        ([[1, -1]], r"token 1 is -1, outside \[0, 2\*\*32 - 1\]"),
        ([[2**32]], r"token 0 is 4294967296, outside"),
        ([[2**80]], r"token 0 is an integer of 81 bits"),
        ([[True]], r"token 0 is a bool \(True\), expected an int"),
        ([np.array([1.0, 2.0])], "NumPy dtype 'f8' \\(only integer dtypes are decoded\\)"),
        ([np.array([3, -5], np.int16)], r"token 1 is -5, outside \[0, 2\*\*32 - 1\] \(int16"),
        ([np.array([2**40], np.uint64)], r"token 0 is 1099511627776, outside"),
        ([np.zeros((2, 2), np.uint8)], "is a 2-D NumPy array of shape"),
        ([np.array([1, "a"], dtype=object)], "NumPy dtype 'O8?'"),
        (["text"], "is a str, expected a list of ints"),
        ([{"input_ids": "abc"}], "field 'input_ids' is a str"),
        ([[1], [2], [3]], "holds 3 examples, expected 2 \\(every block but the last"),
    ],
)
def test_a_bad_block_or_example_names_the_block_and_example(
    tmp_path: Path, block: Any, problem: str
) -> None:
    root = small_dataset(tmp_path, 0)
    folder = shard_folders(root)[0]
    blocks = stored_blocks(folder)
    if isinstance(block, list) and len(block) == 1:
        block = [*block, [7]]  # two examples, as block 1 must hold
    blocks[1] = pickle.dumps(block)
    rewrite_blocks(folder, blocks)
    e = str(one_error(lambda: expand_atlas(root)))
    assert f"{os.path.join(folder, 'data.bin')}: block 1" in e
    assert re.search(problem, e), e


def test_last_block_count_and_stored_examples(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0, n=21)  # 11 blocks, the last of 1 example
    folder = shard_folders(root)[0]
    meta_path = Path(folder, "meta.json")
    meta = json.loads(meta_path.read_text())
    meta["stored_examples"] = 22  # same block count, a last block of 2
    meta_path.write_text(json.dumps(meta))
    e = str(one_error(lambda: expand_atlas(root)))
    assert "block 10" in e and "holds 1 examples, expected 2 (the last block holds" in e
    meta["stored_examples"] = 30  # 15 blocks
    meta_path.write_text(json.dumps(meta))
    e = str(one_error(lambda: expand_atlas(root)))
    assert "index.npy: 12 entries, expected 16" in e


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not UTF-8 JSON"),
        ('{"version": 1, "version": 1}', "appears twice"),
        ("[1]", "is a list, expected a JSON object"),
        (None, "field version: expected 1"),
    ],
)
@pytest.mark.parametrize("which", ["dataset", "shard"])
def test_bad_meta_json(tmp_path: Path, text: str | None, problem: str, which: str) -> None:
    root = small_dataset(tmp_path, 1)
    path = Path(root if which == "dataset" else shard_folders(root)[0], "meta.json")
    if text is None:
        meta = json.loads(path.read_text())
        meta["version"] = 2
        text = json.dumps(meta)
    path.write_text(text)
    e = str(one_error(lambda: expand_atlas(root)))
    assert str(path) in e and problem in e


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("block_size", 0, r"field block_size: expected \[1, "),
        ("block_size", True, "field block_size: expected an integer"),
        ("stored_examples", -1, "field stored_examples: expected"),
        ("stored_examples", None, "field stored_examples: missing"),
        ("compression_strategy", 4, "field compression_strategy: expected 0, 1, 2 or 3"),
        ("compression_strategy", 0, "compression_strategy: 0 in a dataset of strategy 1"),
        ("compression_level", "3", "field compression_level: expected an integer"),
    ],
)
def test_bad_shard_meta_fields(tmp_path: Path, field: str, value: Any, problem: str) -> None:
    root = small_dataset(tmp_path, 1)
    path = Path(shard_folders(root)[0], "meta.json")
    meta = json.loads(path.read_text())
    if value is None:
        del meta[field]
    else:
        meta[field] = value
    path.write_text(json.dumps(meta))
    e = str(one_error(lambda: expand_atlas(root)))
    assert str(path) in e
    assert re.search(problem, e), e


def test_dataset_meta_shard_sizes_and_folders(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    path = Path(root, "meta.json")
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "shard_sizes": [1, -2]}))
    assert "field shard_sizes" in str(one_error(lambda: expand_atlas(root)))
    path.write_text(json.dumps(meta))
    os.mkdir(os.path.join(root, "extra"))
    assert "not a shard" in str(one_error(lambda: expand_atlas(root)))
    os.rmdir(os.path.join(root, "extra"))
    os.rename(os.path.join(root, "1"), os.path.join(root, "00"))
    assert "shard 0 twice" in str(one_error(lambda: expand_atlas(root)))


def test_decompression_bomb_beyond_the_cap(tmp_path: Path) -> None:
    root = str(tmp_path / "ds")
    examples = [[1], [2], np.zeros(3 << 20, dtype=np.uint8), [3]]
    write_dataset(root, [examples], 2, 1)
    (folder,) = shard_folders(root)
    cap = 1 << 20
    e = str(one_error(lambda: expand_atlas(root, max_block_bytes=cap)))
    assert "block 1" in e and "declares" in e and "decompression bomb" in e
    # Without a declared size the frame is stopped as it passes the cap.
    blocks = pickled_blocks(examples, 2)
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    rewrite_blocks(folder, [cctx.compress(b) for b in blocks])
    e = str(one_error(lambda: expand_atlas(root, max_block_bytes=cap)))
    assert "block 1" in e and "more than the cap of 1,048,576" in e and "bomb" in e
    # A stored block larger than the cap is refused from the index alone.
    assert "more than max_block_bytes" in str(
        one_error(lambda: expand_atlas(root, max_block_bytes=10))
    )
    shard = expand_atlas(root)[0]  # the default cap reads it
    assert shard.num_tokens == 3 + (3 << 20)


def test_a_fifo_data_bin_is_refused_without_blocking(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    data = os.path.join(shard_folders(root)[0], "data.bin")
    os.remove(data)
    os.mkfifo(data)
    e = str(one_error(lambda: expand_atlas(root)))
    assert data in e and "not a regular file (a FIFO)" in e


def test_data_changed_between_counting_and_reading(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    folder = shard_folders(root)[0]
    (shard, _) = expand_atlas(root)
    assert shard.num_tokens
    blocks = stored_blocks(folder)
    blocks[0] = pickle.dumps([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [1]])
    with open(os.path.join(folder, "data.bin"), "wb") as f:
        f.write(b"".join(blocks))
    with pytest.raises(IngestError, match="changed while it was read"):
        shard.read_tokens(0, shard.num_tokens)


def test_every_error_is_a_zerobatch_error(tmp_path: Path) -> None:
    """Paths that are not Atlas inputs at all."""
    for bad in (tmp_path / "missing", tmp_path):
        with pytest.raises(ZeroBatchError):
            expand_atlas(str(bad))
    with pytest.raises(IngestError, match="no Atlas inputs"):
        expand_atlas([])


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        # BINBYTES8 claiming 4 EiB: refused before (and without) allocating it.
        (
            b"\x80\x04\x8e" + (2**62).to_bytes(8, "little") + b"x.",
            "BINBYTES8 at offset 2 claims 4,611,686,018,427,387,904 bytes, but 2 remain",
        ),
        # A list nested a million deep: decoded, refused as one example, freed without a crash.
        (b"\x80\x04" + b"]" * 10**6 + b"a" * (10**6 - 1) + b".", "holds 1 examples, expected 2"),
        # A frame of one million marks and nothing else.
        (b"\x80\x04" + b"(" * 10**6 + b".", "not a valid pickle"),
    ],
    ids=["huge-length", "deep-nesting", "marks"],
)
def test_hostile_pickle_shapes_fail_fast(tmp_path: Path, payload: bytes, problem: str) -> None:
    root = small_dataset(tmp_path, 0)
    folder = shard_folders(root)[0]
    blocks = stored_blocks(folder)
    blocks[1] = payload
    rewrite_blocks(folder, blocks)
    e = str(one_error(lambda: expand_atlas(root)))
    assert "data.bin: block 1" in e and re.search(problem, e), e


def test_read_tokens_outside_the_stream(tmp_path: Path) -> None:
    root = small_dataset(tmp_path, 0)
    shard = expand_atlas(root)[0]
    n = shard.num_tokens
    for lo, hi in ((-1, 2), (3, 2), (0, n + 1)):
        with pytest.raises(IngestError, match="outside"):
            shard.read_tokens(lo, hi)
    assert "AtlasShard(" in repr(shard) and shard.num_blocks == 10
    assert shard.side_files()[:3] == [
        os.path.join(folder, name)
        for folder in [shard.path]
        for name in ("meta.json", "index.npy", "data.bin")
    ]


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"\x80\x02]q\x00.", None),
        (b"\x80\x05\x96" + (2**55).to_bytes(8, "little") + b"abc.", "BYTEARRAY8 at offset 2"),
        (b"\x80\x02X\xff\xff\xff\xffab.", "BINUNICODE at offset 2 claims 4,294,967,295"),
        (b"\x80\x02T\xff\xff\xff\xffab.", "BINSTRING at offset 2 claims -1 bytes"),
        (b"\x80\x02]K\x01J\x01\x02", "BININT at offset 5 is cut short"),
        (b"\x80\x02]K\x01", "ends without STOP"),
        (b"\x80\x02\xff.", "unknown opcode 0xff at offset 2"),
        (b"\x80\x02cos\nsystem", "GLOBAL at offset 2 has no newline"),
        (b"\x80\x02\x82\x01.", "opcode EXT1 at offset 2 is not allowed"),
        (b"(ios\nsystem\nS'true'\n.", "opcode INST at offset 1 is not allowed"),
        (b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00].", "pickle data was truncated"),
    ],
)
def test_the_opcode_scan_bounds_every_length_before_unpickling(
    payload: bytes, problem: str | None
) -> None:
    """Lengths claimed beyond the data, unknown or refused opcodes and a missing STOP are
    refused by ``scan_pickle`` before the unpickler allocates or calls anything."""
    if problem is None:
        assert restricted_loads(payload) == []
        return
    with pytest.raises(
        (atlas.PickleRefusedError, pickle.UnpicklingError), match=re.escape(problem)
    ):
        restricted_loads(payload)
