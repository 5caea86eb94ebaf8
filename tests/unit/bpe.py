"""A byte-level BPE model trained in the test itself, so no tokenizer file is ever downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def train_bpe(hf: Any, texts: list[str], path: Path, bos: str, vocab_size: int = 600) -> str:
    """Train a byte-level BPE on ``texts`` with special token ``bos``, save it as ``path``.

    ``hf`` is the ``tokenizers`` module (the caller imports it with ``tests.helpers.require``).
    Returns the model's spec string, ``hf:PATH?bos=BOS``.
    """
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[bos],
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return f"hf:{path}?bos={bos}"
