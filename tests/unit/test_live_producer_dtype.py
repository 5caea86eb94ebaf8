"""``LiveProducer``'s token dtype: recorded in ``live.json``, the dtype of every batch object,
refused for tokens that do not fit it, and for a dataset opened with another dtype."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import DTYPE_UINT16, DTYPE_UINT32, HEADER_SIZE, TOKEN_DTYPES, parse_header
from zerobatch_spec.live import DESCRIPTOR_NAME

from zerobatch_core.live.manifests import LiveError
from zerobatch_core.live.producer import LiveProducer, encode_batches
from zerobatch_core.stores.resolve import open_store

B, T = 3, 5


def batches(n: int, high: int = 2**16, seed: int = 0) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, high, size=(n, B, T), dtype=np.int64)
    out.flat[0], out.flat[-1] = 0, high - 1
    return out


def objects(url: str, producer: LiveProducer) -> list[bytes]:
    store = open_store(url)
    try:
        return [store.read(e.name) for e in producer.chain.entries(producer.base)]
    finally:
        store.close()


def test_encode_batches_writes_uint16_slots_the_spec_way() -> None:
    src = batches(2)
    data = encode_batches(src, seed=7, dtype=DTYPE_UINT16)
    h = parse_header(data)
    assert (h.dtype, h.num_batches, h.seed, h.total_records) == (DTYPE_UINT16, 2, 7, 2 * B)
    assert len(data) == h.file_size
    slots = np.frombuffer(data, TOKEN_DTYPES[DTYPE_UINT16], offset=HEADER_SIZE).reshape(2, -1)
    np.testing.assert_array_equal(slots[:, : B * T].reshape(2, B, T), src)
    assert not slots[:, B * T :].any()


def test_a_uint16_live_dataset_records_its_dtype_and_stores_uint16_objects(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    src = batches(3)
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, dtype="uint16", cadence=1) as p:
        assert (p.dtype, p.token_dtype) == (DTYPE_UINT16, TOKEN_DTYPES[DTYPE_UINT16])
        p.append(src[0])
        p.append(src[1:])
        found = objects(url, p)
    assert json.loads((tmp_path / "live" / DESCRIPTOR_NAME).read_bytes())["dtype"] == DTYPE_UINT16
    assert [parse_header(d).dtype for d in found] == [DTYPE_UINT16, DTYPE_UINT16]
    assert found[1] == encode_batches(src[1:], dtype=DTYPE_UINT16)


def test_a_uint32_live_dataset_keeps_its_descriptor_as_before(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1) as p:
        assert p.dtype == DTYPE_UINT32
        p.append(batches(1, high=2**20))
    assert "dtype" not in json.loads((tmp_path / "live" / DESCRIPTOR_NAME).read_bytes())


@pytest.mark.parametrize("bad", [2**16, -1])
def test_a_token_the_dataset_dtype_cannot_hold_is_refused_and_nothing_appended(
    tmp_path: Path, bad: int
) -> None:
    url = str(tmp_path / "live")
    src = batches(2)
    src[1, 2, 4] = bad
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, dtype=DTYPE_UINT16) as p:
        with pytest.raises(ValueError, match=r"in \[0, 65535\] for this uint16 live dataset"):
            p.append(src)
        assert (p.pending, p.offset) == (0, 0)
        with pytest.raises(ValueError, match=rf"got {bad} at \[batch, row, position\] \[1, 2, 4\]"):
            p.append(src)


def test_opening_a_live_dataset_with_another_dtype_is_refused_naming_both(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, dtype="uint16") as p:
        p.append(batches(1))
    with pytest.raises(LiveError, match="holds uint16 tokens, not uint32"):
        LiveProducer(url, "p-1", dtype="uint32")
    with LiveProducer(url, "p-1") as p:  # no dtype: the dataset's own
        assert p.dtype == DTYPE_UINT16
    with LiveProducer(url, "p-2", dtype=1) as p:
        assert p.dtype == DTYPE_UINT16


def test_an_unknown_dtype_is_refused_before_the_dataset_is_created(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype must be one of 'uint32', 'uint16'"):
        LiveProducer(str(tmp_path / "live"), "p-0", batch_size=B, seq_len=T, dtype="int8")
    assert not (tmp_path / "live" / DESCRIPTOR_NAME).exists()
