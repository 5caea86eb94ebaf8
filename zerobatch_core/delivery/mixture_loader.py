"""``MixtureLoader``: the core loader over a ``Mixture``, with the mixture's resume rules.

Serving is the core loader's, unchanged: a ``MixtureSource`` is a ``BatchSource`` whose slot
``k`` is global step ``k`` (``mixture.py``). What differs is the state: besides the cursor it
records where every component is (by name, with its source's identity), so that a state loads
into the same mixture exactly and into a changed one as section 21.3 says (``mixture.py``'s
module docstring lists what may change).
"""

from __future__ import annotations

import os
from typing import Any, TypeGuard

from zerobatch_spec import TOKEN_DTYPE

from ..datasets.dataset import Verify
from ..datasets.remote import RemoteVerify
from ..errors import StateError
from .loader import (
    BatchNativeLoader,
    Position,
    register_loader_kind,
)
from .mixture import Cursor, Mixture, MixtureSource, is_mixture_file, load_mixture

MixtureLike = Mixture | MixtureSource | str | os.PathLike[str]


def is_mixture(source: object) -> TypeGuard[MixtureLike]:
    """Whether ``source`` is a mixture: a ``Mixture``, its source, or a mixture file."""
    return isinstance(source, (Mixture, MixtureSource)) or is_mixture_file(source)


def open_mixture(
    source: MixtureLike,
    *,
    global_batch_size: int | None = None,
    seed: int | None = None,
    verify: Verify | RemoteVerify | None = None,
) -> tuple[MixtureSource, bool]:
    """``(the mixture's source, whether the caller owns it)``."""
    if isinstance(source, MixtureSource):
        return source, False
    mixture = source if isinstance(source, Mixture) else load_mixture(source)
    return MixtureSource(
        mixture, global_batch_size=global_batch_size, seed=seed, verify=verify
    ), True


class MixtureLoader(BatchNativeLoader):
    """``BatchNativeLoader`` over a mixture (a ``Mixture``, a mixture file or its source).

    The arguments are the core loader's (``options`` are passed to it as they are).
    ``global_batch_size`` sets the mixture's global batch
    (by default the mixture's, else its components' stored batch size); ``block_size`` and
    ``shuffle`` are every component's, and so is ``seed`` when given (each component keeps its
    own seed otherwise). ``dtype="native"`` (the default) and ``"uint16"`` open every component
    to learn the widest token dtype (``MixtureSource.token_dtype``); any other output serves
    the components' tokens as uint32 and opens each at its first use.
    """

    source: MixtureSource

    def __init__(
        self,
        path: MixtureLike,
        *,
        seed: int | None = None,
        global_batch_size: int | None = None,
        verify: Verify | RemoteVerify | None = None,
        **options: Any,
    ) -> None:
        source, owned = open_mixture(
            path, global_batch_size=global_batch_size, seed=seed, verify=verify
        )
        if not owned and global_batch_size not in (None, source.global_batch_size):
            raise ValueError(
                f"{source.path}: the mixture's source serves global batches of "
                f"{source.global_batch_size}, not {global_batch_size}"
            )
        narrow = ("native", "uint16")
        dtypes = (options.get("dtype", "native"), options.get("label_dtype", "int64"))
        if not any(d in narrow for d in dtypes):
            source.serve_as(TOKEN_DTYPE)  # wider outputs: no component is opened to learn it
        try:
            super().__init__(source, seed=seed, **options)
        except BaseException:
            if owned:
                source.close()
            raise

    # -- what a training loop may ask --------------------------------------------------------
    def global_step(self, position: Position | None = None) -> int:
        """The global step of ``position`` (default: the cursor): epochs continue the steps."""
        epoch, step = self.position if position is None else position
        return epoch * self.steps_per_epoch + step

    def component_at(self, position: Position | None = None) -> str:
        """The name of the component serving the step at ``position`` (default: the cursor)."""
        return self.source.component_name(self.global_step(position))

    def component_positions(self, position: Position | None = None) -> dict[str, Cursor]:
        """Every component's cursor ``(its epoch, the sample its next global batch starts
        at)`` at ``position`` (default: the loader's cursor)."""
        step = self.global_step(position)
        return dict(zip(self.source.mixture.names, self.source.positions(step), strict=True))

    def copy(self) -> MixtureLoader:
        twin = MixtureLoader(
            self.source,
            block_size=self.block_size,
            shuffle=self.shuffle,
            seed=self.source.component_seed,
            epoch=self._epoch,
            dtype=self.dtype,
            next_token=self.next_token,
            label_dtype=self.label_dtype,
            bos_id=self.bos_id,
            skip_steps=self.skip_steps,
            slicing=self.slicing,
        )
        twin._identity = self._identity
        twin.load_state_dict(self.state_dict())
        return twin

    # -- checkpointing -----------------------------------------------------------------------
    def state_dict(self, position: Position | None = None) -> dict[str, Any]:
        """The core loader's state, with the mixture's history and every component's position."""
        state = super().state_dict(position)
        history = self.source.history
        names = self.source.mixture.names
        step = self.global_step(Position(state["epoch"], state["step"]))
        state["mixture"] = {
            "component_seed": self.source.component_seed,
            "history": {
                "step": history.step,
                "positions": {n: list(p) for n, p in zip(names, history.positions, strict=True)},
            },
            "step": step,
            "positions": {
                n: list(p) for n, p in zip(names, self.source.positions(step), strict=True)
            },
        }
        return state

    def check_state(self, state: object) -> tuple[int, int, int, int, int, list[list[int]]]:
        return super().check_state(self._translated(state)[0])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        translated, history = self._translated(state)
        e, step, *_ = super().check_state(translated)
        if history is None:  # another blend: a phase starts at the saved step
            saved = state["mixture"]["positions"]
            positions = [_cursor(saved.get(name, [0, 0]), name) for name in self.names]
            self.source.rephase(self.global_step(Position(e, step)), positions)
        else:
            self.source.rephase(*history)
        super().load_state_dict(translated)

    @property
    def names(self) -> tuple[str, ...]:
        """The components' names, in the mixture's order."""
        return self.source.mixture.names

    def _translated(self, state: object) -> tuple[dict[str, Any], tuple[int, list[Cursor]] | None]:
        """``(a state the core loader checks, the history to adopt or None for a re-phase)``.

        The same blend: the state as it is, and its history. Another blend: every component
        still present must have the same source identity; the state's order keys and source
        are then this loader's, since the blend continues from the components' positions."""
        if not isinstance(state, dict) or not isinstance(state.get("mixture"), dict):
            raise StateError(f"{self.source.path}: not a mixture state: {state!r:.200}")
        mix = state["mixture"]
        mine = self.state_dict()
        saved_source = state.get("source")
        theirs = saved_source.get("mixture") if isinstance(saved_source, dict) else None
        if not isinstance(theirs, dict):
            raise StateError(f"{self.source.path}: the state names no mixture")
        for key in ("block_size", "shuffle"):
            if state.get(key) != mine[key]:
                raise StateError(
                    f"{self.source.path}: state has {key}={state.get(key)!r} but this loader "
                    f"has {key}={mine[key]!r} (components would be read in another order)"
                )
        if mix.get("component_seed") != self.source.component_seed:
            raise StateError(
                f"{self.source.path}: the state's components were read with seed "
                f"{mix.get('component_seed')!r}, this loader's with {self.source.component_seed!r}"
            )
        ours = mine["source"]["mixture"]
        sources = theirs.get("sources")
        if not isinstance(sources, dict):
            raise StateError(f"{self.source.path}: the state's mixture lists no sources")
        for name, identity in ours["sources"].items():
            if name in sources and sources[name] != identity:
                raise StateError(
                    f"{self.source.path}: component {name!r} is another source than the one "
                    f"the state was saved with ({sources[name]!r:.120} there, "
                    f"{identity!r:.120} here)"
                )
        if theirs == ours:
            history = mix.get("history")
            if not isinstance(history, dict) or not isinstance(history.get("positions"), dict):
                raise StateError(f"{self.source.path}: the state's mixture history is invalid")
            step = _count(history.get("step"), "history step")
            positions = [_cursor(history["positions"].get(n, [0, 0]), n) for n in self.names]
            return state, (step, positions)
        saved = mix.get("positions")
        if not isinstance(saved, dict):
            raise StateError(f"{self.source.path}: the state's component positions are invalid")
        for name, value in saved.items():
            _cursor(value, name)
        if state.get("num_workers", 1) != 1:
            raise StateError("a worker's state cannot resume a changed mixture")
        translated = dict(state)
        for key in ("num_batches", "batch_size", "seq_len", "file_seed", "seed", "source"):
            translated[key] = mine[key]
        translated["global_batch_size"] = mine["global_batch_size"]
        translated["samples"] = mine["samples"]
        # The saved global step, in this mixture's epochs of steps (which may have changed).
        step = _count(mix.get("step"), "mixture step")
        n = self.steps_per_epoch
        translated["epoch"], translated["step"] = divmod(step, n) if n else (0, 0)
        translated["origin"] = 0
        return translated, None


def _cursor(value: object, name: str) -> Cursor:
    """A component's ``[epoch, sample]`` cursor from a state, checked."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise StateError(f"state position of component {name!r} is not [epoch, sample]")
    return _count(value[0], f"epoch of {name!r}"), _count(value[1], f"sample of {name!r}")


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"state {what} {value!r:.80} is not a non-negative integer")
    return value


register_loader_kind(is_mixture, MixtureLoader)
