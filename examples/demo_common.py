"""The framework-independent half of the training demo: data, settings, loop and sampling.

- ``read_corpus`` and ``write_corpus_dataset`` turn the public-domain texts in ``corpus/``
  (beside this file) into an LLMBATCH file: ``zerobatch_core.ByteTokenizer`` (UTF-8 bytes
  plus BOS, vocabulary 257), ``pack_documents`` into records of ``seq_len + 1`` tokens, and
  ``write_batch_dataset``, which shuffles them by a seed.
- ``ModelConfig`` and ``TrainConfig`` are the settings both framework modules read, and
  ``learning_rate`` the schedule they both follow.
- ``train_loop`` runs any framework's step function over the epochs of a ZeroBatch loader,
  prints the loss and measures how long each step waits for its batch; ``generate`` samples
  text from any framework's next-token logits.

Nothing here imports a framework: ``demo_torch`` and ``demo_jax`` supply the model, the
optimizer and the step.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch_core import ByteTokenizer, pack_documents, write_batch_dataset

CORPUS_DIR = Path(__file__).parent / "corpus"
FILE_NAME = "corpus.batch"

# (inputs, labels, learning rate) -> the step's loss as a Python float (which waits for it).
StepFn = Callable[[Any, Any, float], float]
# Token ids of the context -> logits [vocab] for the next token.
NextLogitsFn = Callable[[Sequence[int]], npt.NDArray[np.floating[Any]]]


# -- corpus and dataset ----------------------------------------------------------------------


def read_corpus(folder: Path = CORPUS_DIR) -> list[tuple[str, str]]:
    """The corpus as ``(file name, text)`` pairs, one per ``.txt`` file, in name order."""
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt files in {folder}")
    return [(f.name, f.read_text(encoding="utf-8")) for f in files]


@dataclass(frozen=True)
class DatasetInfo:
    """What ``write_corpus_dataset`` wrote."""

    path: str
    documents: int
    corpus_bytes: int
    batch_size: int
    record_len: int
    num_batches: int
    total_records: int
    file_bytes: int

    @property
    def tokens(self) -> int:
        """Tokens stored in the file's batches (the dropped remainder excluded)."""
        return self.num_batches * self.batch_size * self.record_len


def write_corpus_dataset(
    out_dir: str, *, seq_len: int = 128, batch_size: int = 16, seed: int = 42
) -> DatasetInfo:
    """Tokenize and pack the corpus into ``seq_len + 1``-token records; write ``corpus.batch``.

    Every file is one document, prefixed with BOS. The records are streamed into
    ``write_batch_dataset``, which shuffles them with ``seed`` and drops the records that do
    not fill a last batch.
    """
    tok = ByteTokenizer()
    docs = read_corpus()
    record_len = seq_len + 1
    lengths = [len(text.encode("utf-8")) for _, text in docs]
    total_records = sum(n + 1 for n in lengths) // record_len  # + 1: each document's BOS
    if total_records < batch_size:
        raise ValueError(
            f"the corpus packs into {total_records} records of {record_len} tokens, fewer "
            f"than one batch of {batch_size}"
        )
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, FILE_NAME)
    records = pack_documents((tok.encode(text) for _, text in docs), record_len)
    num_batches = write_batch_dataset(
        path, records, total_records, batch_size, record_len, seed=seed, overwrite=True
    )
    return DatasetInfo(
        path=path,
        documents=len(docs),
        corpus_bytes=sum(lengths),
        batch_size=batch_size,
        record_len=record_len,
        num_batches=num_batches,
        total_records=total_records,
        file_bytes=os.path.getsize(path),
    )


# -- settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """A small pre-norm GPT-style decoder with learned positions and a tied output layer."""

    vocab_size: int = ByteTokenizer.vocab_size
    seq_len: int = 128
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512


@dataclass(frozen=True)
class TrainConfig:
    """Data order, optimisation, budget, logging and sampling settings of both frameworks.

    The optimizer is AdamW (``torch.optim.AdamW``, ``optax.adamw``) with weight decay on the
    weight matrices only, after clipping the gradients' global norm to ``clip_norm``.
    """

    steps: int = 500
    seconds: float = 90.0
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    block_size: int = 8
    data_seed: int = 42  # the loader's block order: seed XOR epoch (the file's seed by default)
    seed: int = 0  # the model's initial weights
    log_every: int = 25
    prompt: str = "To be, or not to be"
    sample_tokens: int = 200
    temperature: float = 0.7


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``cfg.lr``, then cosine decay to ``cfg.min_lr_ratio * cfg.lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


# -- the loop --------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """Losses and timings of one training run."""

    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss) logged
    steps: int = 0
    epochs: float = 0.0
    seconds: float = 0.0
    data_seconds: float = 0.0  # time spent waiting in next(iterator), from step 2 on
    step_seconds: float = 0.0  # data wait + compute, summed over the steps from step 2 on
    sample: str = ""


def train_loop(
    epoch_batches: Callable[[int], Iterable[Any]],
    step_fn: StepFn,
    steps_per_epoch: int,
    cfg: TrainConfig,
) -> TrainResult:
    """Run ``step_fn`` over epochs until ``cfg.steps`` steps or ``cfg.seconds`` have passed.

    ``epoch_batches(e)`` sets the loader's epoch and returns it; the time spent in
    ``next()`` on it is the data loader's share of the step time (measured from the second
    step on: the first includes compilation and warm-up). The loss printed every
    ``cfg.log_every`` steps is the mean over the steps since the previous line.
    """
    result = TrainResult()
    window: list[float] = []
    start = time.perf_counter()
    epoch, done = 0, False
    while not done:
        iterator = iter(epoch_batches(epoch))
        served = 0
        while not done:
            t0 = time.perf_counter()
            try:
                inputs, labels = next(iterator)
            except StopIteration:
                break
            t1 = time.perf_counter()
            loss = step_fn(inputs, labels, learning_rate(result.steps, cfg))
            t2 = time.perf_counter()
            if not math.isfinite(loss):
                raise FloatingPointError(f"step {result.steps + 1}: the loss is {loss}")
            if result.steps:  # the first step (compilation, warm-up) is not typical
                result.data_seconds += t1 - t0
                result.step_seconds += t2 - t0
            result.steps += 1
            served += 1
            window.append(loss)
            out_of_time = t2 - start >= cfg.seconds
            done = result.steps >= cfg.steps or out_of_time
            if result.steps == 1 or result.steps % cfg.log_every == 0 or done:
                mean = sum(window) / len(window)
                window.clear()
                result.losses.append((result.steps, mean))
                print(
                    f"step {result.steps:4d}/{cfg.steps}  epoch {epoch}  loss {mean:.3f}  "
                    f"({t2 - start:5.1f} s)",
                    flush=True,
                )
            if out_of_time and result.steps < cfg.steps:
                print(f"stopping: the time budget of {cfg.seconds:g} s is spent", flush=True)
        if served == 0:
            raise RuntimeError(f"the data loader served no batches in epoch {epoch}")
        epoch += 1
    result.seconds = time.perf_counter() - start
    result.epochs = result.steps / steps_per_epoch
    return result


def generate(
    next_logits: NextLogitsFn,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    context: int,
    seed: int = 0,
) -> str:
    """Sample ``max_new_tokens`` bytes after ``prompt`` (greedy when ``temperature`` is 0)."""
    tok = ByteTokenizer()
    ids = tok.encode(prompt).tolist()
    rng = np.random.default_rng(seed)
    for _ in range(max_new_tokens):
        logits = np.asarray(next_logits(ids[-context:]), dtype=np.float64)
        if temperature <= 0:
            ids.append(int(np.argmax(logits)))
            continue
        z = logits / temperature
        p = np.exp(z - z.max())
        ids.append(int(rng.choice(p.size, p=p / p.sum())))
    return tok.decode(ids)
