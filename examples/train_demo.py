"""Train a tiny byte-level language model on the CPU from an LLMBATCH file, end to end.

``python examples/train_demo.py [--framework torch|jax] [--out DIR] [--steps N]``

1. Reads the public-domain texts in ``corpus/`` beside this script, tokenizes them byte by
   byte and packs them into records of ``seq_len + 1`` tokens (``demo_common``).
2. Writes them, shuffled by a seed, as an LLMBATCH file with ``write_batch_dataset``.
3. Trains a small decoder-only transformer on the file for a few epochs through the PyTorch
   adapter with ``torch.optim.AdamW`` (``demo_torch``) or the JAX adapter with ``optax.adamw``
   (``demo_jax``), printing the loss, the data loader's share of the step time and a sample of
   generated text.

The framework is imported only once it is chosen, so ``--help`` is instant and the PyTorch
path needs neither JAX nor optax. The same arguments give the same losses.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from demo_common import ModelConfig, TrainConfig, TrainResult, write_corpus_dataset

from zerobatch_core import ByteTokenizer

DEFAULT_OUT = "demo-output"

TrainFn = Callable[[str, ModelConfig, TrainConfig], TrainResult]


def trainer(framework: str) -> TrainFn:
    """The chosen framework's training function, imported only now."""
    if framework == "torch":
        from demo_torch import train_torch

        return train_torch
    from demo_jax import train_jax

    return train_jax


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python examples/train_demo.py",
        description="Write the public-domain corpus in examples/corpus as an LLMBATCH file and "
        "train a tiny byte-level transformer on it through a ZeroBatch framework adapter "
        "(PyTorch on the CPU with torch.optim.AdamW, or JAX on its default devices with "
        "optax.adamw).",
    )
    p.add_argument("--framework", choices=("torch", "jax"), default="torch")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument(
        "--steps", type=_positive_int, default=d.steps, help=f"training steps (default {d.steps})"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=d.seconds,
        help=f"time budget: stop early after this many seconds (default {d.seconds:g})",
    )
    p.add_argument("--batch-size", type=_positive_int, default=16)
    p.add_argument(
        "--seq-len", type=_positive_int, default=128, help="model context (records are +1)"
    )
    p.add_argument("--seed", type=int, default=d.data_seed, help="the file's record shuffling seed")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--log-every", type=_positive_int, default=d.log_every)
    p.add_argument("--prompt", default=d.prompt, help="start of the generated sample")
    p.add_argument(
        "--sample-tokens", type=int, default=d.sample_tokens, help="bytes to generate (0: none)"
    )
    p.add_argument("--temperature", type=float, default=d.temperature)
    return p


def report(result: TrainResult, cfg: TrainConfig, tokens_per_step: int) -> None:
    """Print the run's summary: losses, speed, the data loader's share and the sample."""
    first, last = result.losses[0][1], result.losses[-1][1]
    timed = max(1, result.steps - 1)  # steps 2..N (see train_loop)
    ms = 1e3 * result.step_seconds / timed
    tokens_per_s = result.steps * tokens_per_step / max(result.seconds, 1e-9)
    share = 100 * result.data_seconds / max(result.step_seconds, 1e-12)
    print(
        f"trained {result.steps} steps ({result.epochs:.1f} epochs) in {result.seconds:.1f} s: "
        f"{ms:.0f} ms/step, {tokens_per_s:,.0f} tokens/s; loss {first:.3f} -> {last:.3f}\n"
        f"data loader: {1e3 * result.data_seconds / timed:.2f} ms of {ms:.1f} ms per step "
        f"waiting on next(iterator) = {share:.2f}% of step time",
        flush=True,
    )
    if result.sample:
        print(f"sample (temperature {cfg.temperature:g}, prompt {cfg.prompt!r}):")
        for line in result.sample.splitlines() or [""]:
            print(f"  | {line}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the exit status."""
    args = _parser().parse_args(argv)
    if args.seq_len < 2:
        raise SystemExit("--seq-len must be at least 2")
    print(f"ZeroBatch training demo ({args.framework})", flush=True)
    t0 = time.perf_counter()
    info = write_corpus_dataset(
        args.out, seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed
    )
    dropped = info.total_records - info.num_batches * info.batch_size
    print(
        f"corpus: {info.documents} files of public-domain text, {info.corpus_bytes:,} bytes, "
        f"byte-level tokens (vocabulary {ByteTokenizer.vocab_size}: 256 bytes + BOS)\n"
        f"wrote {info.path}: {info.num_batches} batches of [{info.batch_size}, "
        f"{info.record_len}], {info.tokens:,} tokens, {info.file_bytes:,} bytes "
        f"(records shuffled with seed {args.seed}, {dropped} left over dropped) "
        f"in {time.perf_counter() - t0:.2f} s",
        flush=True,
    )
    cfg = TrainConfig(
        steps=args.steps,
        seconds=args.seconds,
        lr=args.lr,
        warmup_steps=min(TrainConfig.warmup_steps, max(1, args.steps // 10)),
        data_seed=args.seed,
        log_every=args.log_every,
        prompt=args.prompt,
        sample_tokens=args.sample_tokens,
        temperature=args.temperature,
    )
    result = trainer(args.framework)(info.path, ModelConfig(seq_len=args.seq_len), cfg)
    report(result, cfg, info.batch_size * args.seq_len)
    print(f"dataset kept at {info.path}; inspect it with: zerobatch inspect {info.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
