"""Train a tiny byte-level language model on CPU from an LLMBATCH file, end to end.

``python -m zerobatch_adapters.train_demo [--framework torch|jax] [--out DIR] [--steps N]``

1. Reads the public-domain corpus shipped with this package (``zerobatch_adapters/corpus``),
   tokenizes it with ``zerobatch_core.ByteTokenizer`` (UTF-8 bytes plus BOS, vocabulary 257)
   and packs the documents into records of ``seq_len + 1`` tokens.
2. Writes them, shuffled by a seed, as an LLMBATCH file with ``write_batch_dataset``.
3. Trains a small decoder-only transformer on the file for a few epochs through the PyTorch
   adapter (``TorchBatchDataset``) or the JAX adapter (``JaxBatchIterator``, model and Adam in
   plain ``jax.numpy``), printing the loss, the data loader's share of the step time and a
   sample of generated text.

The framework is imported only once it is chosen, so ``--help`` is instant and the module
imports without either installed.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch_core import ByteTokenizer, pack_documents, write_batch_dataset

CORPUS_PACKAGE = "zerobatch_adapters"
CORPUS_DIR = "corpus"
DEFAULT_OUT = "demo-output"
FILE_NAME = "corpus.batch"

# (inputs, labels, learning rate) -> the step's loss as a Python float (which waits for it).
StepFn = Callable[[Any, Any, float], float]
# Token ids of the context -> logits [vocab] for the next token.
NextLogitsFn = Callable[[Sequence[int]], npt.NDArray[np.floating[Any]]]


# -- corpus and dataset ----------------------------------------------------------------------


def read_corpus() -> list[tuple[str, str]]:
    """The shipped corpus as ``(file name, text)`` pairs, in name order."""
    folder = resources.files(CORPUS_PACKAGE).joinpath(CORPUS_DIR)
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".txt")), key=lambda f: f.name)
    if not files:
        raise FileNotFoundError(f"no .txt files in {CORPUS_PACKAGE}/{CORPUS_DIR}")
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
        path, records, total_records, batch_size, record_len, seed=seed
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


# -- configuration ---------------------------------------------------------------------------


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
    """Optimisation, budget, logging and sampling settings shared by both frameworks."""

    steps: int = 500
    seconds: float = 90.0
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    betas: tuple[float, float] = (0.9, 0.99)
    clip_norm: float = 1.0
    block_size: int = 8
    log_every: int = 25
    seed: int = 0
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


# -- the framework-independent loop ----------------------------------------------------------


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


# -- PyTorch ---------------------------------------------------------------------------------


def train_torch(path: str, model_cfg: ModelConfig, cfg: TrainConfig) -> TrainResult:
    """Train through ``zerobatch_adapters.torch.TorchBatchDataset`` (iterated directly)."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812
    from zerobatch_adapters.torch import TorchBatchDataset

    class Block(nn.Module):
        def __init__(self, c: ModelConfig) -> None:
            super().__init__()
            self.n_heads = c.n_heads
            self.ln1 = nn.LayerNorm(c.d_model)
            self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
            self.proj = nn.Linear(c.d_model, c.d_model)
            self.ln2 = nn.LayerNorm(c.d_model)
            self.fc = nn.Linear(c.d_model, c.d_ff)
            self.out = nn.Linear(c.d_ff, c.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            heads = (b, t, self.n_heads, d // self.n_heads)
            q, k, v = (z.view(heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
            return out

    class TinyLM(nn.Module):
        def __init__(self, c: ModelConfig) -> None:
            super().__init__()
            self.tok = nn.Embedding(c.vocab_size, c.d_model)
            self.pos = nn.Embedding(c.seq_len, c.d_model)
            self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
            self.ln_f = nn.LayerNorm(c.d_model)
            for name, p in self.named_parameters():
                if name.endswith("weight") and p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * c.n_layers) if "out" in name else 0.02
                    nn.init.normal_(p, std=std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.tok(ids) + self.pos(positions)
            for block in self.blocks:
                x = block(x)
            logits: torch.Tensor = self.ln_f(x) @ self.tok.weight.T  # tied to the embedding
            return logits

    torch.manual_seed(cfg.seed)
    model = TinyLM(model_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {model_cfg.n_layers} layers, d_model {model_cfg.d_model}, "
        f"{model_cfg.n_heads} heads, {n_params:,} parameters; PyTorch {torch.__version__} "
        f"on {torch.get_num_threads()} CPU threads",
        flush=True,
    )
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=cfg.betas)
    dataset = TorchBatchDataset(path, block_size=cfg.block_size, next_token=True, dtype="int64")

    def epoch_batches(epoch: int) -> TorchBatchDataset:
        dataset.set_epoch(epoch)
        return dataset

    def step(inputs: torch.Tensor, labels: torch.Tensor, lr: float) -> float:
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        opt.step()
        return float(loss.item())

    model.train()
    result = train_loop(epoch_batches, step, len(dataset), cfg)
    model.eval()

    def next_logits(ids: Sequence[int]) -> npt.NDArray[np.floating[Any]]:
        with torch.no_grad():
            logits = model(torch.tensor([list(ids)], dtype=torch.int64))
        out: npt.NDArray[np.floating[Any]] = logits[0, -1].numpy()
        return out

    if cfg.sample_tokens > 0:
        result.sample = generate(
            next_logits, cfg.prompt, cfg.sample_tokens, cfg.temperature, model_cfg.seq_len
        )
    return result


# -- JAX -------------------------------------------------------------------------------------


def train_jax(path: str, model_cfg: ModelConfig, cfg: TrainConfig) -> TrainResult:
    """Train through ``zerobatch_adapters.jax.JaxBatchIterator``: plain jax.numpy, own Adam."""
    import jax
    import jax.numpy as jnp
    from zerobatch_adapters.jax import JaxBatchIterator

    c = model_cfg
    head_dim = c.d_model // c.n_heads

    def init_params(key: jax.Array) -> dict[str, Any]:
        keys = iter(jax.random.split(key, 2 + 4 * c.n_layers))

        def normal(shape: tuple[int, ...], std: float = 0.02) -> jax.Array:
            return std * jax.random.normal(next(keys), shape, dtype=jnp.float32)

        def zeros(n: int) -> jax.Array:
            return jnp.zeros((n,), dtype=jnp.float32)

        def ones(n: int) -> jax.Array:
            return jnp.ones((n,), dtype=jnp.float32)

        out_std = 0.02 / math.sqrt(2 * c.n_layers)
        blocks = [
            {
                "ln1_g": ones(c.d_model),
                "ln1_b": zeros(c.d_model),
                "w_qkv": normal((c.d_model, 3 * c.d_model)),
                "b_qkv": zeros(3 * c.d_model),
                "w_proj": normal((c.d_model, c.d_model)),
                "b_proj": zeros(c.d_model),
                "ln2_g": ones(c.d_model),
                "ln2_b": zeros(c.d_model),
                "w_fc": normal((c.d_model, c.d_ff)),
                "b_fc": zeros(c.d_ff),
                "w_out": normal((c.d_ff, c.d_model), out_std),
                "b_out": zeros(c.d_model),
            }
            for _ in range(c.n_layers)
        ]
        return {
            "tok": normal((c.vocab_size, c.d_model)),
            "pos": normal((c.seq_len, c.d_model)),
            "blocks": blocks,
            "lnf_g": ones(c.d_model),
            "lnf_b": zeros(c.d_model),
        }

    def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b

    def forward(params: dict[str, Any], ids: jax.Array) -> jax.Array:
        b, t = ids.shape
        x: jax.Array = params["tok"][ids] + params["pos"][:t]
        mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        for p in params["blocks"]:
            qkv = layer_norm(x, p["ln1_g"], p["ln1_b"]) @ p["w_qkv"] + p["b_qkv"]
            q, k, v = (z.reshape(b, t, c.n_heads, head_dim) for z in jnp.split(qkv, 3, -1))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
            weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
            y = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, c.d_model)
            x = x + y @ p["w_proj"] + p["b_proj"]
            h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w_fc"] + p["b_fc"])
            x = x + h @ p["w_out"] + p["b_out"]
        x = layer_norm(x, params["lnf_g"], params["lnf_b"])
        logits: jax.Array = x @ params["tok"].T  # output layer tied to the embedding
        return logits

    def loss_fn(params: dict[str, Any], inputs: jax.Array, labels: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(forward(params, inputs), axis=-1)
        nll: jax.Array = -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()
        return nll

    b1, b2 = cfg.betas

    def train_step(
        params: dict[str, Any],
        opt: dict[str, Any],
        inputs: jax.Array,
        labels: jax.Array,
        lr: jax.Array,
    ) -> tuple[dict[str, Any], dict[str, Any], jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, labels)
        leaves = jax.tree_util.tree_leaves(grads)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
        scale = jnp.minimum(1.0, cfg.clip_norm / (norm + 1e-6))
        grads = jax.tree_util.tree_map(lambda g: g * scale, grads)
        t = opt["t"] + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
        step_size = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - step_size * m / (jnp.sqrt(v) + 1e-8), params, m, v
        )
        return params, {"m": m, "v": v, "t": t}, loss

    params = init_params(jax.random.key(cfg.seed))
    zeros_like = jax.tree_util.tree_map(jnp.zeros_like, params)
    opt: dict[str, Any] = {"m": zeros_like, "v": zeros_like, "t": jnp.zeros((), jnp.float32)}
    n_params = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
    print(
        f"model: {c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, "
        f"{n_params:,} parameters; JAX {jax.__version__} on {jax.device_count()} "
        f"{jax.default_backend().upper()} device(s)",
        flush=True,
    )
    jit_step = jax.jit(train_step)
    state = {"params": params, "opt": opt}

    def step(inputs: jax.Array, labels: jax.Array, lr: float) -> float:
        state["params"], state["opt"], loss = jit_step(
            state["params"], state["opt"], inputs, labels, jnp.float32(lr)
        )
        return float(loss)  # waits for the step, so the timing is the step's

    batches = JaxBatchIterator(path, block_size=cfg.block_size, next_token=True)
    try:

        def epoch_batches(epoch: int) -> JaxBatchIterator[Any]:
            batches.set_epoch(epoch)
            return batches

        result = train_loop(epoch_batches, step, len(batches), cfg)
    finally:
        batches.close()

    jit_forward = jax.jit(forward)
    window = np.zeros((1, c.seq_len), dtype=np.int32)

    def next_logits(ids: Sequence[int]) -> npt.NDArray[np.floating[Any]]:
        # One compiled shape: the context left-aligned in a full window (causal attention
        # makes the padding after it irrelevant), read at the context's last position.
        window[0, : len(ids)] = ids
        logits = jit_forward(state["params"], jnp.asarray(window))
        return np.asarray(logits[0, len(ids) - 1])

    if cfg.sample_tokens > 0:
        result.sample = generate(
            next_logits, cfg.prompt, cfg.sample_tokens, cfg.temperature, c.seq_len
        )
    return result


# -- command line ----------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m zerobatch_adapters.train_demo",
        description="Write the shipped public-domain corpus as an LLMBATCH file and train a "
        "tiny byte-level transformer on it through a ZeroBatch framework adapter (PyTorch "
        "on CPU, or JAX on its default devices).",
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
    p.add_argument("--seed", type=int, default=42, help="the file's record shuffling seed")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--log-every", type=_positive_int, default=d.log_every)
    p.add_argument("--prompt", default=d.prompt, help="start of the generated sample")
    p.add_argument(
        "--sample-tokens", type=int, default=d.sample_tokens, help="bytes to generate (0: none)"
    )
    p.add_argument("--temperature", type=float, default=d.temperature)
    return p


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
    model_cfg = ModelConfig(seq_len=args.seq_len)
    cfg = TrainConfig(
        steps=args.steps,
        seconds=args.seconds,
        lr=args.lr,
        warmup_steps=min(TrainConfig.warmup_steps, max(1, args.steps // 10)),
        log_every=args.log_every,
        prompt=args.prompt,
        sample_tokens=args.sample_tokens,
        temperature=args.temperature,
    )
    train = train_torch if args.framework == "torch" else train_jax
    result = train(info.path, model_cfg, cfg)

    first, last = result.losses[0][1], result.losses[-1][1]
    timed = max(1, result.steps - 1)  # steps 2..N (see train_loop)
    ms = 1e3 * result.step_seconds / timed
    tokens_per_s = result.steps * info.batch_size * args.seq_len / max(result.seconds, 1e-9)
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
    print(f"dataset kept at {info.path}; inspect it with: zerobatch inspect {info.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
