"""The training demo in PyTorch: a tiny transformer, ``torch.optim.AdamW``, ``TorchBatchDataset``.

The adapter's ``TorchBatchDataset`` is iterated directly (no ``DataLoader`` workers: the
batches are already formed), one epoch after another through ``set_epoch``, and yields
``(inputs, labels)`` int64 tensors, the batch shifted by one token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from demo_common import ModelConfig, TrainConfig, TrainResult, generate, train_loop
from torch import nn
from torch.nn import functional as F  # noqa: N812
from zerobatch_adapters.torch import TorchBatchDataset


class Block(nn.Module):
    """Pre-norm causal self-attention, then a GELU MLP, each added to the residual."""

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
    """Token and position embeddings, ``n_layers`` blocks, an output layer tied to the tokens."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.n_layers) if name.endswith("out.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.ln_f(x) @ self.tok.weight.T
        return logits


def train_torch(path: str, model_cfg: ModelConfig, cfg: TrainConfig) -> TrainResult:
    """Train a ``TinyLM`` on the LLMBATCH file at ``path``; sample from it afterwards."""
    torch.manual_seed(cfg.seed)
    model = TinyLM(model_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {model_cfg.n_layers} layers, d_model {model_cfg.d_model}, "
        f"{model_cfg.n_heads} heads, {n_params:,} parameters; PyTorch {torch.__version__} "
        f"on {torch.get_num_threads()} CPU threads; torch.optim.AdamW",
        flush=True,
    )
    # Weight decay on the weight matrices only, not on biases and LayerNorm gains.
    groups: list[dict[str, Any]] = [
        {"params": [p for p in model.parameters() if p.dim() >= 2]},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)

    def step(inputs: torch.Tensor, labels: torch.Tensor, lr: float) -> float:
        for group in optimizer.param_groups:
            group["lr"] = lr
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        optimizer.step()
        return float(loss.item())

    with TorchBatchDataset(
        path, block_size=cfg.block_size, seed=cfg.data_seed, next_token=True, dtype="int64"
    ) as dataset:

        def epoch_batches(epoch: int) -> TorchBatchDataset:
            dataset.set_epoch(epoch)
            return dataset

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
