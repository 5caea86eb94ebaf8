"""Mixtures (SPEC.md section 21): which component serves each step, each component's own
sequence, exact resume, and resume into a changed blend without repeating or skipping."""

from __future__ import annotations

import json
import pickle
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec.mixture import Phase, mixture_order, weight_units

from tests.helpers import records
from zerobatch_core import (
    BatchNativeLoader,
    BatchStream,
    Component,
    Mixture,
    MixtureError,
    MixtureLoader,
    StateError,
    load_mixture,
    write_batch_file,
)
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.delivery.mixture import ENDLESS_STEPS

T = 12
G = 8


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    """Four sources whose rows are unique across all of them (a row's first token names it)."""
    out = {}
    out["file"] = tmp_path / "file.batch"
    write_batch_file(out["file"], records(8 * 7, T), batch_size=8, seed=3)  # 7 batches of 8
    out["ds"] = tmp_path / "ds"
    rows = records(4 * 23, T) + 10_000
    write_sharded_dataset(out["ds"], [rows], batch_size=4, seq_len=T, shard_batches=5, seed=4)
    out["big"] = tmp_path / "big.batch"  # stored batches of 16: a global batch is half of one
    write_batch_file(out["big"], records(16 * 5, T) + 20_000, batch_size=16, seed=5)
    out["other"] = tmp_path / "other.batch"
    write_batch_file(out["other"], records(8 * 6, T) + 30_000, batch_size=8, seed=6)
    return out


def own_sequence(path: Path, steps: int, **kw: Any) -> list[np.ndarray]:
    """A component's own uninterrupted sequence of global batches, over as many epochs."""
    loader = BatchNativeLoader(path, global_batch_size=G, **kw)
    out: list[np.ndarray] = []
    while len(out) < steps:
        out.extend(np.array(b) for b in loader)
    return out[:steps]


def units(*weights: Any) -> tuple[int, ...]:
    return tuple(weight_units(w) for w in weights)


def serve(loader: BatchNativeLoader, steps: int) -> list[tuple[str, np.ndarray]]:
    out = []
    it = iter(loader)
    for _ in range(steps):
        name = loader.component_at()  # type: ignore[attr-defined]
        out.append((name, np.array(next(it))))
    return out


def test_components_follow_the_rule_and_their_own_sequences(sources: dict[str, Path]) -> None:
    mix = Mixture(
        [("f", sources["file"], 0.5), ("d", sources["ds"], 0.3), ("b", sources["big"], 0.2)],
        global_batch_size=G,
    )
    loader = BatchNativeLoader(mix, block_size=2)
    assert isinstance(loader, MixtureLoader)
    assert loader.steps_per_epoch == ENDLESS_STEPS
    want = [c for c, _ in mixture_order([Phase(0, units(0.5, 0.3, 0.2))], 0, 10_000)]
    names = ["f", "d", "b"]
    got = [names.index(loader.component_at((0, k))) for k in range(10_000)]
    assert got == want
    counts = [0, 0, 0]
    for t, c in enumerate(got, start=1):
        counts[c] += 1
        for n, w in zip(counts, (5, 3, 2), strict=True):
            assert abs(n - Fraction(t * w, 10)) < 1
    served = serve(loader, 400)
    for name, path in zip(names, (sources["file"], sources["ds"], sources["big"]), strict=True):
        mine = [b for n, b in served if n == name]
        for a, b in zip(mine, own_sequence(path, len(mine), block_size=2), strict=True):
            np.testing.assert_array_equal(a, b)


def test_views_where_a_step_is_one_stored_batch(sources: dict[str, Path]) -> None:
    mix = Mixture([("f", sources["file"], 1), ("b", sources["big"], 1)], global_batch_size=G)
    loader = BatchNativeLoader(mix)
    for batch in [b for _, b in zip(range(6), loader, strict=False)]:
        assert not batch.flags.writeable and batch.base is not None  # a view of the mapping


def test_two_phases_and_an_exact_resume(sources: dict[str, Path]) -> None:
    mix = Mixture(
        [("f", sources["file"], 0.6), ("d", sources["ds"], 0.4), ("o", sources["other"], 0)],
        schedule=[(50, {"f": 0.1, "o": 0.9})],
        global_batch_size=G,
    )
    phases = [Phase(0, units(0.6, 0.4, 0)), Phase(50, units(0.1, 0, 0.9))]
    want = [c for c, _ in mixture_order(phases, 0, 120)]
    loader = MixtureLoader(mix, dtype="int64", next_token=True)
    names = loader.names
    assert [names.index(loader.component_at((0, k))) for k in range(120)] == want
    uninterrupted = serve(loader.copy(), 120)
    it = iter(loader)
    for _ in range(30):  # phase 1
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # a state survives JSON
    again = MixtureLoader(mix, dtype="int64", next_token=True)
    again.load_state_dict(state)
    rest = serve(again, 90)
    for (n1, (a1, b1)), (n2, (a2, b2)) in zip(rest, uninterrupted[30:], strict=True):
        assert n1 == n2
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)


@pytest.mark.parametrize("change", ["weights", "add-and-remove", "global-batch"])
def test_a_changed_blend_repeats_and_skips_nothing(sources: dict[str, Path], change: str) -> None:
    old = Mixture(
        [("f", sources["file"], 0.5), ("d", sources["ds"], 0.3), ("b", sources["big"], 0.2)],
        global_batch_size=G,
    )
    k = 37
    loader = MixtureLoader(old, block_size=3)
    before = serve(loader, k)
    state = loader.state_dict()
    g = G
    if change == "weights":
        new = Mixture(
            [("f", sources["file"], 0.1), ("d", sources["ds"], 0.1), ("b", sources["big"], 0.8)],
            global_batch_size=G,
        )
        weights = units(0.1, 0.1, 0.8)
    elif change == "add-and-remove":
        new = Mixture(
            [("b", sources["big"], 1), ("o", sources["other"], 2), ("f", sources["file"], 1)],
            global_batch_size=G,
        )
        weights = units(1, 2, 1)
    else:
        g = 4
        new = Mixture(
            [("f", sources["file"], 0.5), ("d", sources["ds"], 0.3), ("b", sources["big"], 0.2)],
            global_batch_size=g,
        )
        weights = units(0.5, 0.3, 0.2)
    resumed = MixtureLoader(new, block_size=3)
    resumed.load_state_dict(state)
    assert resumed.global_step() == k
    after = serve(resumed, 150)
    # From k on, the new weights hold as a phase starting at k.
    want = [c for c, _ in mixture_order([Phase(0, weights)], 0, 150)]
    assert [resumed.names.index(n) for n, _ in after] == want
    # Every component's samples, before and after k, are a prefix of its own sequence.
    paths = {"f": sources["file"], "d": sources["ds"], "b": sources["big"], "o": sources["other"]}
    for name, path in paths.items():
        rows = [b for n, b in before if n == name] + [b for n, b in after if n == name]
        if not rows:
            continue
        served = np.concatenate(rows)
        if g == G:
            whole = np.concatenate(own_sequence(path, len(rows) + 2, block_size=3))
            np.testing.assert_array_equal(served, whole[: len(served)])
        assert_epochs_in_order(served[:, 0], path, max(g, G))


def assert_epochs_in_order(firsts: np.ndarray, path: Path, most_dropped: int) -> None:
    """``firsts`` (rows' first tokens) walk the component's epochs in order, each row once,
    leaving out at most ``most_dropped - 1`` rows at the end of an epoch."""
    loader = BatchNativeLoader(path, block_size=3)
    epochs: list[list[int]] = []
    e, i = 0, 0
    for token in firsts.tolist():
        while len(epochs) <= e + 1:
            epochs.append([int(r) for b in loader for r in b[:, 0]])
        if i < len(epochs[e]) and epochs[e][i] == token:
            i += 1
            continue
        assert len(epochs[e]) - i < most_dropped, f"row {token} skips rows of epoch {e}"
        e, i = e + 1, 0
        assert epochs[e][0] == token, f"row {token} does not start epoch {e}"
        i = 1


def test_a_component_with_another_source_is_refused_by_name(sources: dict[str, Path]) -> None:
    mix = Mixture([("f", sources["file"], 1), ("d", sources["ds"], 1)], global_batch_size=G)
    loader = MixtureLoader(mix)
    serve(loader, 5)
    state = loader.state_dict()
    swapped = Mixture([("f", sources["other"], 1), ("d", sources["ds"], 1)], global_batch_size=G)
    with pytest.raises(StateError, match="component 'f' is another source"):
        MixtureLoader(swapped).load_state_dict(state)
    with pytest.raises(StateError, match="block_size"):
        MixtureLoader(mix, block_size=7).load_state_dict(state)
    with pytest.raises(StateError, match="not a mixture state"):
        MixtureLoader(mix).load_state_dict(BatchNativeLoader(sources["file"]).state_dict())


def test_ranks_and_context_shares_reassemble_the_components_batch(
    sources: dict[str, Path],
) -> None:
    mix = Mixture([("f", sources["file"], 2), ("d", sources["ds"], 1)], global_batch_size=G)
    whole = [b for _, b in zip(range(20), BatchNativeLoader(mix), strict=False)]
    parts = {}
    for dp in range(2):
        for cp in range(2):
            loader = BatchNativeLoader(mix, rank=dp, world_size=2, context_rank=cp, context_size=2)
            parts[dp, cp] = [np.array(b) for _, b in zip(range(20), loader, strict=False)]
    for step, batch in enumerate(whole):
        rows = [np.concatenate([parts[dp, cp][step] for cp in range(2)], axis=1) for dp in range(2)]
        np.testing.assert_array_equal(np.concatenate(rows), batch)


def test_the_stream_a_pickled_loader_and_a_finite_mixture(sources: dict[str, Path]) -> None:
    mix = Mixture([("f", sources["file"], 1), ("o", sources["other"], 3)], steps=10)
    with BatchStream(mix, dtype="int64") as stream:
        assert len(stream) == 10
        first = [np.array(b) for b in stream]
        second = [np.array(b) for b in stream]  # the next epoch continues the blend
    loader = BatchNativeLoader(mix, dtype="int64")
    steps = [np.array(b) for _ in range(2) for b in loader]
    for a, b in zip(first + second, steps, strict=True):
        np.testing.assert_array_equal(a, b)
    twin = pickle.loads(pickle.dumps(loader))
    assert twin.state_dict() == loader.state_dict()
    assert [twin.component_at((0, k)) for k in range(10)] == [
        loader.component_at((0, k)) for k in range(10)
    ]


def test_mixture_files_and_bad_mixtures(sources: dict[str, Path], tmp_path: Path) -> None:
    doc = {
        "format": "zerobatch.mixture",
        "version": 1,
        "components": [
            {"name": "f", "source": "file.batch", "weight": 0.7},
            {"name": "o", "source": str(sources["other"]), "weight": 0.3},
        ],
        "schedule": [{"start": 5, "weights": {"o": 1}}],
        "global_batch_size": 8,
    }
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(doc))
    mix = load_mixture(path)
    assert mix.components[0] == Component("f", str(sources["file"]), "0.7")
    loader = BatchNativeLoader(path)
    assert isinstance(loader, MixtureLoader)
    assert [loader.component_at((0, k)) for k in range(8)][5:] == ["o", "o", "o"]
    for bad, message in [
        ({**doc, "format": "x"}, "format must be"),
        ({**doc, "components": []}, "components must be a non-empty list"),
        ({**doc, "schedule": [{"start": 5, "weights": {"zz": 1}}]}, "no component named 'zz'"),
        ({**doc, "schedule": [{"start": 0, "weights": {"o": 1}}]}, "start step"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(MixtureError, match=message):
            load_mixture(path)
    with pytest.raises(MixtureError, match="unique"):
        Mixture([("a", sources["file"], 1), ("a", sources["other"], 1)])
    with pytest.raises(MixtureError, match="fraction digits"):
        Mixture([("a", sources["file"], "0.0000000001")])
    with pytest.raises(MixtureError, match="stores batches of 4"):
        BatchNativeLoader(Mixture([("f", sources["file"], 1), ("d", sources["ds"], 1)]))
    small = Mixture([("f", sources["file"], 1)], global_batch_size=64)
    with pytest.raises(MixtureError, match="fewer than one global batch"):
        next(iter(BatchNativeLoader(small)))


def test_a_live_dataset_component_serves_in_commit_order(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    from zerobatch_core.live import LiveProducer

    live = str(tmp_path / "live")
    with LiveProducer(live, "p-0", batch_size=G, seq_len=T, cadence=1) as producer:
        for i in range(6):
            producer.append(records(G, T) + 40_000 + 1000 * i)
    mix = Mixture([("f", sources["file"], 1), ("live", live, 1)], global_batch_size=G)
    loader = MixtureLoader(mix)
    served = serve(loader, 10)
    live_rows = [b for n, b in served if n == "live"]
    assert len(live_rows) == 5
    for i, batch in enumerate(live_rows):  # the live component's own order: commit order
        np.testing.assert_array_equal(batch, records(G, T) + 40_000 + 1000 * i)
    loader.source.close()


def test_a_state_resumes_on_another_world_size_and_context_layout(
    sources: dict[str, Path],
) -> None:
    mix = Mixture([("f", sources["file"], 0.6), ("d", sources["ds"], 0.4)], global_batch_size=G)
    whole = MixtureLoader(mix)
    it = iter(whole)
    for _ in range(9):
        next(it)
    state = whole.state_dict()
    rest = [np.array(a) for _, a in zip(range(6), it, strict=False)]
    chunk = T // 4
    for dp in range(2):
        for cp in range(2):
            rank = MixtureLoader(
                mix, rank=dp, world_size=2, context_rank=cp, context_size=2, zigzag=True
            )
            rank.load_state_dict(state)
            assert rank.global_step() == 9
            cols = np.r_[cp * chunk : (cp + 1) * chunk, (3 - cp) * chunk : (4 - cp) * chunk]
            got = [np.array(a) for _, a in zip(range(6), rank, strict=False)]
            for a, want in zip(got, rest, strict=True):
                np.testing.assert_array_equal(a, want[dp * G // 2 : (dp + 1) * G // 2][:, cols])


def test_mixture_files_are_told_from_batch_files(sources: dict[str, Path], tmp_path: Path) -> None:
    from zerobatch_core.delivery.mixture import SNIFF_BYTES, is_mixture_file

    doc = {
        "format": "zerobatch.mixture",
        "version": 1,
        "components": [{"name": "f", "source": str(sources["file"])}],
    }
    named = tmp_path / "blend.mix"  # no .json suffix: the format's name is found
    named.write_text("\n" * 100 + json.dumps(doc))
    assert is_mixture_file(named) and isinstance(BatchNativeLoader(named), MixtureLoader)
    late = tmp_path / "late.mix"  # the name beyond the bytes searched: not a mixture
    late.write_text("{" + " " * SNIFF_BYTES + json.dumps(doc)[1:])
    assert not is_mixture_file(late)
    assert not is_mixture_file(sources["file"]) and not is_mixture_file(sources["ds"])
    assert not is_mixture_file(tmp_path / "missing.json") and not is_mixture_file(3)
