"""Greedy decode with a static KV cache and one captured CUDA graph per batch size.

:class:`CapturedDecoder` captures the decode step itself, with everything it reads and
writes in fixed tensors (a ``transformers.StaticCache`` of ``max_len`` positions per
batch size); on the CPU every step runs eagerly. The step, the capture and the limits:
docs/models.md#fast-decode-recipe.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass
class _State:
    cache: object
    tokens: torch.Tensor  # [B, 1] int64: the step's input, then its output
    pos: torch.Tensor  # [1] int64: the position of tokens
    graph: torch.cuda.CUDAGraph | None = None
    stream: torch.cuda.Stream | None = None
    length: int = 0  # tokens in the sequence: the prompt and those generated


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache by: ``"cache"`` in newer transformers 5.x
    (5.24; ``past_key_values`` there only warns), else ``"past_key_values"``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decode_step(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    pos: torch.Tensor,
    keys: torch.Tensor,
    cache,
    cache_kw: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """One greedy decode step on fixed tensors, in place: ``tokens`` <- argmax of the next
    logits, ``pos`` += 1; returns those logits ``[B, vocab]``.

    ``tokens``: ``[B, 1]`` int64 at position ``pos`` (``[1]`` int64); ``keys``: the cache's
    positions ``arange(max_len)``, masked past ``pos`` in ``dtype``; ``cache``: the static KV
    cache, passed to ``model`` by the keyword ``cache_kw`` (:func:`cache_keyword`). Reads and
    writes only these tensors, so it can be captured in a CUDA graph or compiled.
    """
    batch = tokens.shape[0]
    allowed = (keys <= pos).view(1, 1, 1, -1).expand(batch, 1, 1, -1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=pos.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    out = model(
        input_ids=tokens,
        position_ids=pos.view(1, 1).expand(batch, 1),
        cache_position=pos,
        attention_mask=mask,
        **{cache_kw: cache},
        use_cache=True,
    )
    logits = out.logits[:, -1, :]
    tokens.copy_(logits.argmax(dim=-1, keepdim=True))
    pos.add_(1)
    return logits


def _static_window(config, max_len: int) -> int | None:
    """The fewest positions a layer of ``transformers.StaticCache(config, max_len)`` keeps.

    Sliding-window and chunked attention layers keep ``min(window, max_len)``; asked of
    transformers itself (the cache's layers are made lazily: nothing is allocated).
    None when no layer states a length.
    """
    from transformers import StaticCache

    lengths = [
        getattr(layer, "max_cache_len", None)
        for layer in StaticCache(config=config, max_cache_len=max_len).layers
    ]
    lengths = [n for n in lengths if isinstance(n, int)]
    return min(lengths) if lengths else None


class CapturedDecoder:
    """Greedy decoding of a transformers causal LM with a static cache and CUDA graphs.

    Args:
        model: a transformers causal LM (Llama family; any q2gemv layers inside) in eval
            mode, on one device.
        max_len: the static cache's length: prompt plus new tokens must fit. A model
            with sliding-window (or chunked) attention layers keeps at most its window in
            their static cache, so ``max_len`` beyond the window is refused (ValueError
            naming ``max_len``): the step's mask spans ``max_len`` positions.
        capture: capture the decode step in a CUDA graph (default: when the model is on
            CUDA). False runs every step eagerly (CPU, debugging).

    One static cache and one graph per batch size, made at the first ``generate`` (or
    ``prefill``) of that batch size and reused (the cache is reset in place) by later
    calls. ``generate(ids, n)`` is ``prefill(ids)`` then ``n - 1`` times ``step()``.
    """

    def __init__(self, model: torch.nn.Module, max_len: int, *, capture: bool | None = None):
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise TypeError(f"model: expected a transformers model, got {type(model).__name__}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
            raise ValueError(f"max_len: expected an int >= 2, got {max_len!r}")
        self.model = model
        self.max_len = max_len
        self.device = next(model.parameters()).device
        self.dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        self.capture = self.device.type == "cuda" if capture is None else bool(capture)
        if self.capture and self.device.type != "cuda":
            raise ValueError(
                f"capture: CUDA graphs need a CUDA model, this one is on {self.device}"
            )
        window = _static_window(model.config, max_len)
        if window is not None and window < max_len:
            raise ValueError(
                f"max_len: this model has sliding-window attention whose static cache keeps "
                f"{window} positions (config.sliding_window or attention_chunk_size); "
                f"CapturedDecoder needs every layer to keep max_len positions, so max_len "
                f"must be <= {window}, got {max_len}"
            )
        self._states: dict[int, _State] = {}
        self._current: _State | None = None
        self._keys = torch.arange(max_len, device=self.device)
        self._cache_kw = cache_keyword(model)

    def _state(self, batch: int) -> _State:
        st = self._states.get(batch)
        if st is None:
            from transformers import StaticCache

            cache = StaticCache(config=self.model.config, max_cache_len=self.max_len)
            st = _State(
                cache,
                torch.zeros((batch, 1), dtype=torch.long, device=self.device),
                torch.zeros(1, dtype=torch.long, device=self.device),
            )
            self._states[batch] = st
        else:
            st.cache.reset()
        return st

    def _step(self, st: _State) -> None:
        """One decode step on the fixed tensors: tokens <- argmax(next logits), pos += 1."""
        decode_step(self.model, st.tokens, st.pos, self._keys, st.cache, self._cache_kw, self.dtype)

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt (uncaptured) into the batch size's static cache; the first new tokens.

        ``input_ids``: ``[B, P]`` token ids, every prompt of the same length ``P``
        (no padding), ``P < max_len``. Returns the greedy next tokens ``[B, 1]`` (int64);
        :meth:`step` continues from them.
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids: expected a [batch, prompt] tensor of token ids")
        if input_ids.dtype not in (torch.int64, torch.int32) or input_ids.shape[1] < 1:
            raise ValueError(
                f"input_ids: expected int64 ids with a prompt of >= 1 token, got "
                f"{input_ids.dtype} {tuple(input_ids.shape)}"
            )
        if input_ids.shape[0] < 1:
            raise ValueError(
                f"input_ids: expected a batch of >= 1 prompts, got shape {tuple(input_ids.shape)}"
            )
        batch, prompt = input_ids.shape
        if prompt >= self.max_len:
            raise ValueError(
                f"input_ids: a prompt of {prompt} tokens leaves no room in max_len={self.max_len}"
            )
        ids = input_ids.to(device=self.device, dtype=torch.long)
        st = self._state(batch)
        out = self.model(
            input_ids=ids,
            cache_position=torch.arange(prompt, device=self.device),
            **{self._cache_kw: st.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        st.tokens.copy_(out.logits[:, -1, :].argmax(dim=-1, keepdim=True))
        st.pos.fill_(prompt)
        st.length = prompt + 1
        self._current = st
        return st.tokens.clone()

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """One decode step after :meth:`prefill` (a graph replay once captured); tokens ``[B, 1]``.

        The sequence (prompt and generated tokens) may grow to ``max_len`` tokens.
        """
        st = self._current
        if st is None:
            raise RuntimeError("step: call prefill(input_ids) first")
        if st.length >= self.max_len:
            raise ValueError(
                f"step: the sequence has reached max_len={self.max_len} tokens (the static cache)"
            )
        self._advance(st)
        st.length += 1
        return st.tokens.clone()

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation: ``[B, P]`` prompt ids -> ``[B, P + max_new_tokens]`` ids.

        All prompts have the same length ``P`` (no padding); ``P + max_new_tokens``
        must not exceed ``max_len``. No stop token: exactly ``max_new_tokens`` are made.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens: expected an int, got {max_new_tokens!r}")
        prompt = input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) else 0
        if max_new_tokens < 1 or prompt + max_new_tokens > self.max_len:
            raise ValueError(
                f"max_new_tokens: expected 1..{self.max_len - prompt} (max_len {self.max_len} "
                f"minus the prompt's {prompt} tokens), got {max_new_tokens}"
            )
        new = [self.prefill(input_ids)]
        new += [self.step() for _ in range(max_new_tokens - 1)]
        return torch.cat([input_ids.to(device=self.device, dtype=torch.long), *new], dim=1)

    def _advance(self, st: _State) -> None:
        if not self.capture:
            self._step(st)
            return
        if st.graph is None:
            st.stream = torch.cuda.Stream(self.device)
            st.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(st.stream):
                self._step(st)  # a real step, and the warm-up before capture
            torch.cuda.current_stream(self.device).wait_stream(st.stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=st.stream):
                self._step(st)  # recorded, not run
            st.graph = graph
            return
        st.graph.replay()
