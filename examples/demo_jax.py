"""The training demo in JAX: a transformer in ``jax.numpy``, ``optax.adamw``, ``JaxBatchIterator``.

The adapter's ``JaxBatchIterator`` serves ``(inputs, labels)`` as int32 ``jax.Array``s whose
batch axis is split over all devices (one CPU device, or the ones
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` simulates), prefetched while the
previous step runs; ``jax.jit`` follows that sharding. The learning rate comes from the shared
schedule on the host, fed to optax through ``optax.inject_hyperparams``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import optax
from demo_common import ModelConfig, TrainConfig, TrainResult, generate, train_loop
from jax.sharding import NamedSharding, PartitionSpec
from zerobatch_adapters.jax import JaxBatchIterator, default_sharding

Params = dict[str, Any]

# No axis split: every device holds the whole array (the weights and the optimizer state).
REPLICATED = PartitionSpec()  # type: ignore[no-untyped-call]


def init_params(c: ModelConfig, key: jax.Array) -> Params:
    """The same layout and initialisation as ``demo_torch.TinyLM``, as a pytree of arrays."""
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
    """Normalise the last axis to zero mean and unit variance, then scale by ``g``, add ``b``."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def forward(c: ModelConfig, params: Params, ids: jax.Array) -> jax.Array:
    """Logits ``[batch, t, vocab]`` for token ids ``[batch, t]`` (causal: position i sees <= i)."""
    b, t = ids.shape
    head_dim = c.d_model // c.n_heads
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


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW decaying the weight matrices only.

    ``inject_hyperparams`` keeps the learning rate in the optimizer state, so each step can
    set it from the shared schedule without recompiling.
    """

    def decay_mask(params: Params) -> Any:
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    def clipped_adamw(learning_rate: float) -> optax.GradientTransformation:
        return optax.chain(
            optax.clip_by_global_norm(cfg.clip_norm),
            optax.adamw(
                learning_rate,
                b1=cfg.betas[0],
                b2=cfg.betas[1],
                weight_decay=cfg.weight_decay,
                mask=decay_mask,
            ),
        )

    return optax.inject_hyperparams(clipped_adamw)(learning_rate=cfg.lr)


def train_jax(path: str, model_cfg: ModelConfig, cfg: TrainConfig) -> TrainResult:
    """Train the model on the LLMBATCH file at ``path``; sample from it afterwards."""
    c = model_cfg
    optimizer = make_optimizer(cfg)

    def loss_fn(params: Params, inputs: jax.Array, labels: jax.Array) -> jax.Array:
        logits = forward(c, params, inputs)
        loss: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss

    @jax.jit
    def train_step(
        params: Params, opt_state: Any, inputs: jax.Array, labels: jax.Array, lr: jax.Array
    ) -> tuple[Params, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, labels)
        opt_state.hyperparams["learning_rate"] = lr
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # Batches arrive split by rows over every device; the weights and the optimizer state are
    # replicated on the same devices, so every step after the first reuses its compilation.
    data = default_sharding()
    replicated = NamedSharding(data.mesh, REPLICATED)
    params = jax.device_put(init_params(c, jax.random.key(cfg.seed)), replicated)
    state = {"params": params, "opt": jax.device_put(optimizer.init(params), replicated)}
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    print(
        f"model: {c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, "
        f"{n_params:,} parameters; JAX {jax.__version__} on {jax.device_count()} "
        f"{jax.default_backend().upper()} device(s); optax.adamw",
        flush=True,
    )

    def step(inputs: jax.Array, labels: jax.Array, lr: float) -> float:
        state["params"], state["opt"], loss = train_step(
            state["params"], state["opt"], inputs, labels, jnp.float32(lr)
        )
        return float(loss)  # waits for the step, so the timing is the step's

    with JaxBatchIterator(
        path,
        block_size=cfg.block_size,
        seed=cfg.data_seed,
        next_token=True,
        dtype="int32",
        prefetch=2,
        sharding=data,
    ) as batches:

        def epoch_batches(epoch: int) -> Iterable[Any]:
            batches.set_epoch(epoch)
            return batches

        result = train_loop(epoch_batches, step, len(batches), cfg)

    jit_forward = jax.jit(forward, static_argnums=0)
    window = np.zeros((1, c.seq_len), dtype=np.int32)

    def next_logits(ids: Sequence[int]) -> npt.NDArray[np.floating[Any]]:
        # One compiled shape: the context left-aligned in a full window (causal attention
        # makes the padding after it irrelevant), read at the context's last position.
        window[0, : len(ids)] = ids
        logits = jit_forward(c, state["params"], jnp.asarray(window))
        return np.asarray(logits[0, len(ids) - 1])

    if cfg.sample_tokens > 0:
        result.sample = generate(
            next_logits, cfg.prompt, cfg.sample_tokens, cfg.temperature, c.seq_len
        )
    return result
