"""Child processes of the live-dataset tests and benchmark: producers and consumers that can
be killed at any point and started again.

``python -m tests.remote.live_worker produce URL ID COUNT [CADENCE]`` appends batches ``offset
.. COUNT - 1`` of producer ``ID`` (resuming at the committed offset) and commits them;
``consume URL STATE OUT COUNT`` reads global batches from the state in file STATE (if any) up
to COUNT, appending one line per batch to OUT and saving the loader state after each batch
(the line, then the state written atomically), so a consumer killed anywhere can be
restored.

Every batch is ``batch(producer, i)``: all rows hold ``tag(producer, i) + arange(seq_len)``, so
a batch identifies itself and a torn or mixed batch is visible.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import numpy.typing as npt

B, T = 4, 16


def tag(producer: int, i: int) -> int:
    """The first token of batch ``i`` of producer ``producer``."""
    return (producer * 100_000 + i) * 32


def batch(producer: int, i: int) -> npt.NDArray[np.uint32]:
    row = np.arange(T, dtype=np.uint32) + np.uint32(tag(producer, i))
    return np.broadcast_to(row, (B, T)).copy()


def identify(item: npt.NDArray[np.integer]) -> tuple[int, int]:
    """``(producer, i)`` of a served batch; raises if it is not one whole batch."""
    first = int(item[0, 0])
    if not np.array_equal(item, batch(*divmod(first // 32, 100_000))):
        raise AssertionError(f"a torn or foreign batch starting with {first}")
    return divmod(first // 32, 100_000)


def produce(url: str, producer: str, count: int, cadence: str = "adaptive") -> None:
    from zerobatch_core.live.producer import LiveProducer

    number = int(producer.rsplit("-", 1)[-1])
    k: str | int = cadence if cadence == "adaptive" else int(cadence)
    with LiveProducer(url, producer, batch_size=B, seq_len=T, cadence=k, segment_size=16) as p:
        for i in range(p.offset, count):
            p.append(batch(number, i))


def consume(url: str, state_path: str, out_path: str, count: int) -> None:
    from zerobatch_core import BatchStream

    with BatchStream(url, dtype="uint32", prefetch=0) as stream:
        stream.loader.source.timeout = 120.0  # type: ignore[union-attr]
        if os.path.exists(state_path):
            with open(state_path) as f:
                stream.load_state_dict(json.load(f))
        if stream.position.step >= count:
            return
        with open(out_path, "a") as out:
            for item in stream:
                who = identify(np.asarray(item))
                state = stream.state_dict()
                # The line first, then the checkpoint: a kill in between re-serves this step
                # after the restore, with the same content, and the test sees that.
                out.write(f"{state['step']} {who[0]} {who[1]}\n")
                out.flush()
                temp = f"{state_path}.tmp"
                with open(temp, "w") as f:
                    json.dump(state, f)
                os.replace(temp, state_path)
                if state["step"] >= count:
                    return


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "produce":
        produce(args[0], args[1], int(args[2]), *(args[3:4]))
    elif mode == "consume":
        consume(args[0], args[1], args[2], int(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
