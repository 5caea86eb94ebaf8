"""Which source kind a path is: other systems' token formats by their files, the rest by suffix
(``ingest.formats.detect_format``, ``ingest.convert.detect_kind``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.atlas_writer import write_dataset as write_atlas
from tests.fuzz.fuzz_megatron import write_dataset as megatron_bytes
from tests.helpers import require
from tests.mds_writer import write_mds
from tests.unit.test_ingest_nanogpt import write_shard
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.convert import detect_kind
from zerobatch_core.ingest.formats import detect_format

INT32_CODE = 4  # Megatron's dtype code for int32


def _megatron(prefix: Path) -> Path:
    idx, data = megatron_bytes([[1, 2, 3], [4]], [0, 1, 2], INT32_CODE)
    prefix.with_suffix(".idx").write_bytes(idx)
    prefix.with_suffix(".bin").write_bytes(data)
    return prefix


def test_token_formats_are_told_by_their_files(tmp_path: Path) -> None:
    pa, pq = require("pyarrow"), require("pyarrow.parquet")
    prefix = _megatron(tmp_path / "corpus")
    for path in (prefix, prefix.with_suffix(".idx"), prefix.with_suffix(".bin")):
        assert detect_format(str(path)) == "megatron"
    nanogpt = write_shard(tmp_path / "fineweb_000.bin", np.arange(10))
    assert detect_format(str(nanogpt)) is None  # a .bin without Megatron's .idx
    tokens = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), tokens)
    text = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "input_ids": ["x", "y"]}), text)
    assert detect_format(str(tokens)) == "hf"
    assert detect_format(str(text)) is None  # a string column named input_ids is text
    assert detect_format(str(tokens), column="ids") is None
    write_mds(tmp_path / "mds", {"input_ids": "ndarray:int32"}, [{"input_ids": np.ones(3, "i4")}])
    assert detect_format(str(tmp_path / "mds")) == "mds"
    write_atlas(str(tmp_path / "atlas"), [[[1, 2], [3]]], block_size=2, strategy=0)
    assert detect_format(str(tmp_path / "atlas")) == "atlas"
    (tmp_path / "empty").mkdir()
    assert detect_format(str(tmp_path / "empty")) is None
    assert detect_format(str(tmp_path / "m*")) == "mds"  # a glob: its first match
    assert detect_format(str(tmp_path / "nothing*")) is None


def test_detect_kind_mixes_nothing(tmp_path: Path) -> None:
    prefix = _megatron(tmp_path / "corpus")
    shard = write_shard(tmp_path / "fineweb_000.bin", np.arange(10))
    assert detect_kind([str(prefix)]) == "megatron"
    assert detect_kind([str(shard)]) == "nanogpt"
    with pytest.raises(IngestError, match=r"sources mix kinds \['megatron', 'nanogpt'\]"):
        detect_kind([str(prefix), str(shard)])
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match=r"cannot tell the source kind.*Atlas directory"):
        detect_kind([str(tmp_path / "empty")])
