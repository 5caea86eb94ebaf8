"""``MixtureLoader``'s ownership of its source, its refusals of bad states, and the edges of
resuming into a changed blend (each assertion fails with a slip in ``mixture_loader.py``)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import records
from zerobatch_core import Mixture, MixtureLoader, StateError, write_batch_file
from zerobatch_core.delivery.mixture import MixtureSource
from zerobatch_core.delivery.mixture_loader import open_mixture

G, T = 4, 8


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    out = []
    for k in range(3):
        path = tmp_path / f"{k}.batch"
        write_batch_file(path, records(G * 6, T) + 1000 * k, batch_size=G, seed=k)
        out.append(path)
    return out


def take(loader: MixtureLoader, n: int) -> list[np.ndarray]:
    return [np.array(b) for _, b in zip(range(n), loader, strict=False)]


def test_who_owns_the_source(files: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    mix = Mixture([("a", files[0], 1), ("b", files[1], 1)])
    source = MixtureSource(mix)
    assert open_mixture(source) == (source, False)
    opened, owned = open_mixture(mix)
    assert owned and opened is not source
    opened.close()
    with pytest.raises(ValueError, match="serves global batches of 4, not 2"):
        MixtureLoader(source, global_batch_size=2)
    assert MixtureLoader(mix, global_batch_size=2).source.global_batch_size == 2
    closed: list[MixtureSource] = []
    close = MixtureSource.close

    def spy(self: MixtureSource) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(MixtureSource, "close", spy)
    with pytest.raises(ValueError):
        MixtureLoader(source, world_size=3)  # 4 rows over 3 ranks: refused
    assert closed == []  # the caller's source stays open
    with pytest.raises(ValueError):
        MixtureLoader(mix, world_size=3)
    assert len(closed) == 1  # the source it opened is closed


def test_global_steps_count_over_epochs(files: list[Path]) -> None:
    loader = MixtureLoader(Mixture([("a", files[0], 1)], steps=10))
    assert loader.global_step((2, 3)) == 23
    assert loader.component_positions((0, 3)) == {"a": (0, 12)}


def test_refusals_of_states(files: list[Path]) -> None:
    mix = Mixture([("a", files[0], 1), ("b", files[1], 2)])
    loader = MixtureLoader(mix)
    take(loader, 5)
    state = loader.state_dict()
    with pytest.raises(StateError, match=r"shuffle=False \(components would be read in another"):
        MixtureLoader(mix, shuffle=False).load_state_dict(state)
    for history in ([1], {"step": 0}, {"positions": []}):
        bad = copy.deepcopy(state)
        bad["mixture"]["history"] = history
        with pytest.raises(StateError, match="history is invalid"):
            MixtureLoader(mix).load_state_dict(bad)
    changed = Mixture([("a", files[0], 3), ("b", files[1], 1)])
    for value, message in (
        (5, r"not \[epoch, sample\]"),
        ([0], r"not \[epoch, sample\]"),
        ([True, 0], "epoch of 'gone'"),
        (["x", 0], "epoch of 'gone'"),
        ([0, -1], "sample of 'gone'"),
    ):
        bad = copy.deepcopy(state)
        bad["mixture"]["positions"]["gone"] = value  # a component the new blend dropped
        with pytest.raises(StateError, match=message):
            MixtureLoader(changed).load_state_dict(bad)


def test_missing_history_positions_and_worker_count_take_their_defaults(
    files: list[Path],
) -> None:
    mix = Mixture([("a", files[0], 1), ("b", files[1], 2)])
    loader = MixtureLoader(mix, block_size=1)  # each epoch in another order
    take(loader, 5)
    state = loader.state_dict()
    after = take(loader, 6)
    bare = copy.deepcopy(state)
    bare["mixture"]["history"]["positions"] = {}  # (0, 0) each, as the uninterrupted run
    again = MixtureLoader(mix, block_size=1)
    again.load_state_dict(bare)
    for a, b in zip(take(again, 6), after, strict=True):
        np.testing.assert_array_equal(a, b)
    changed = Mixture([("a", files[0], 2), ("b", files[1], 1)])
    del bare["num_workers"]  # a whole loader's state
    resumed = MixtureLoader(changed, block_size=1)
    resumed.load_state_dict(bare)
    assert resumed.global_step() == 5 and resumed.state_dict()["origin"] == 0


def test_a_changed_blend_of_no_steps_resumes_at_its_start(files: list[Path]) -> None:
    loader = MixtureLoader(Mixture([("a", files[0], 1)]))
    take(loader, 3)
    state = loader.state_dict()
    empty = MixtureLoader(Mixture([("a", files[0], 1), ("c", files[2], 1)], steps=0))
    empty.load_state_dict(state)
    assert tuple(empty.position) == (0, 0)
    assert empty.component_positions()["a"] == (0, 3 * G)  # where the state left it
