"""Document layout from BOS: checked against a plain per-token reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from zerobatch_core.delivery.documents import document_layout

BOS = 7


def reference(tokens: np.ndarray) -> tuple[list[list[int]], list[list[int]], list[int]]:
    seg, pos, cu = [], [], []
    offset = 0
    for row in tokens.tolist():
        s, p, cur_s, cur_p = [], [], 0, 0
        for t, tok in enumerate(row):
            if t == 0 or tok == BOS:
                cur_s, cur_p = cur_s + 1, 0
                cu.append(offset + t)
            s.append(cur_s)
            p.append(cur_p)
            cur_p += 1
        seg.append(s)
        pos.append(p)
        offset += len(row)
    cu.append(offset)
    return seg, pos, cu


def test_worked_example() -> None:
    tokens = np.array([[7, 1, 2, 7, 3], [4, 5, 7, 6, 7]], dtype=np.uint32)
    layout = document_layout(tokens, BOS)
    assert layout.segment_ids.tolist() == [[1, 1, 1, 2, 2], [1, 1, 2, 2, 3]]
    assert layout.positions.tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 1, 0]]
    assert layout.cu_seqlens.tolist() == [0, 3, 5, 7, 9, 10]
    assert layout.segment_ids.dtype == layout.positions.dtype == layout.cu_seqlens.dtype == np.int32


@settings(max_examples=200)
@given(
    arrays(np.uint32, st.tuples(st.integers(1, 6), st.integers(1, 12)), elements=st.integers(0, 9))
)
def test_matches_reference(tokens: np.ndarray) -> None:
    layout = document_layout(tokens, BOS)
    seg, pos, cu = reference(tokens)
    assert layout.segment_ids.tolist() == seg
    assert layout.positions.tolist() == pos
    assert layout.cu_seqlens.tolist() == cu


def test_loader_yields_the_layout(tmp_path: object) -> None:
    import pathlib

    from zerobatch_core import BatchNativeLoader, write_batch_file

    path = pathlib.Path(str(tmp_path)) / "d.batch"
    rng = np.random.default_rng(0)
    write_batch_file(path, rng.integers(0, 10, size=(40, 12), dtype=np.uint32), 4, seed=1)
    plain = list(BatchNativeLoader(path, block_size=3, dtype="int64", next_token=True))
    docs = list(BatchNativeLoader(path, block_size=3, dtype="int64", next_token=True, bos_id=BOS))
    for (inputs, labels), item in zip(plain, docs, strict=True):
        np.testing.assert_array_equal(item["inputs"], inputs)
        np.testing.assert_array_equal(item["labels"], labels)
        want = document_layout(inputs, BOS)
        np.testing.assert_array_equal(item["segment_ids"], want.segment_ids)
        np.testing.assert_array_equal(item["positions"], want.positions)
        np.testing.assert_array_equal(item["cu_seqlens"], want.cu_seqlens)
    tokens = next(iter(BatchNativeLoader(path, bos_id=BOS)))
    assert set(tokens) == {"tokens", "segment_ids", "positions", "cu_seqlens"}
