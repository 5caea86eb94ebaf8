"""Property: a producer stopped after any object and restarted commits the stream of an
uninterrupted run, batch for batch, for any corpus, shape, object size, mode and share; and its
documents are each committed once per epoch (pack mode with a pad id)."""

from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.produce_corpus import PAD, decode, producer_streams
from zerobatch_core.ingest.produce import produce

documents = st.lists(st.text(alphabet="abcdeé ", min_size=0, max_size=40), min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.lists(documents, min_size=1, max_size=4),
    seq_len=st.integers(1, 24),
    batch_size=st.integers(1, 4),
    per_object=st.integers(1, 5),
    mode=st.sampled_from(["pack", "pad"]),
    producers=st.integers(1, 3),
    epochs=st.integers(1, 2),
    stops=st.lists(st.integers(1, 4), min_size=1, max_size=6),
)
def test_restarts_commit_the_uninterrupted_stream(
    files: list[list[str]],
    seq_len: int,
    batch_size: int,
    per_object: int,
    mode: str,
    producers: int,
    epochs: int,
    stops: list[int],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = []
        for k, docs in enumerate(files):
            path = root / f"f{k}.jsonl"
            path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
            paths.append(str(path))
        producers = min(producers, len(paths))
        options = {
            "seq_len": seq_len,
            "batch_size": batch_size,
            "batches_per_object": per_object,
            "mode": mode,
            "pad_id": PAD,
            "producers": producers,
            "epochs": epochs,
            "seed": 3,
        }
        reference, resumed = str(root / "reference"), str(root / "resumed")
        for i in range(producers):
            produce(paths, reference, producer_id=f"p{i}", index=i, **options)  # type: ignore[arg-type]
            for budget in [*stops, 10**9]:
                calls = [0]

                def stop(budget: int = budget, calls: list[int] = calls) -> bool:
                    calls[0] += 1
                    return calls[0] >= budget

                done = produce(paths, resumed, producer_id=f"p{i}", index=i, stop=stop, **options)  # type: ignore[arg-type]
                if done.finished:
                    break
        want = producer_streams(reference)
        got = producer_streams(resumed)
        assert {p: [b.tobytes() for b in s] for p, s in got.items()} == {
            p: [b.tobytes() for b in s] for p, s in want.items()
        }
        if mode == "pack":
            found: collections.Counter[str] = collections.Counter()
            for stream in got.values():
                found.update(decode(stream))
            corpus = collections.Counter(d for docs in files for d in docs)
            assert found == collections.Counter({d: n * epochs for d, n in corpus.items()})
