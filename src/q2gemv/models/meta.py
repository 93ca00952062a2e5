"""Finishing a transformers model built on the meta device once its weights are loaded."""

from __future__ import annotations

import torch


def finish_meta_model(model: torch.nn.Module, source: str) -> None:
    """Tie the embeddings, rebuild meta rotary embeddings, check nothing is left on ``meta``.

    A model built under ``torch.device("meta")`` has no data; a loader sets every
    parameter, then this: ties ``lm_head`` to the embeddings when the config says so,
    rebuilds each rotary-embedding module whose buffers are on the meta device (they are
    computed from the config, not loaded) on the CPU, and raises ``ValueError`` naming
    ``source`` and up to eight tensors that are still on the meta device.
    """
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    for name, mod in list(model.named_modules()):
        if name.endswith("rotary_emb") and any(b.is_meta for b in mod.buffers()):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attr, type(mod)(config=config))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{source}: not loaded, still on the meta device: {left[:8]}")
