"""Swap the Linear layers of a small torch model for q2gemv layers, then check every bit.

Builds a 3-Linear MLP with random weights, replaces its Linears by
``q2gemv.torch.Q2Linear`` (group 128) and ``Nvfp4Linear``, runs it on CUDA if
available (else the CPU, through q2gemv's reference backend), and checks each
swapped layer's output against ``q2gemv.gemv(..., backend="reference")`` plus
the bias, bit for bit.

    python examples/torch_swap.py            # prints one line per layer, then "OK"
"""

from __future__ import annotations

import numpy as np
import torch

import q2gemv
from q2gemv.torch import Nvfp4Linear, Q2Linear, replace_linears


def build_model(k: int = 256, hidden: int = 512, n: int = 64, seed: int = 0) -> torch.nn.Module:
    """A small bf16 MLP with random weights and biases."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(k, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, n),
    ).to(torch.bfloat16)


def reference_output(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's output computed by q2gemv's NumPy reference, plus the bias (bf16 add)."""
    a = x.detach().cpu().reshape(-1, layer.in_features).contiguous()
    y = q2gemv.gemv(
        a.view(torch.int16).numpy().view(q2gemv.BF16),
        layer.quantized_weight(),
        backend="reference",
        numerics=layer.numerics,
    )
    y = torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
    y = y.reshape(*x.shape[:-1], layer.out_features)
    return y if layer.bias is None else y + layer.bias.cpu()


def main(device: str | None = None) -> int:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model()
    # the last layer in NVFP4, the others in Q2_0 (any mix works)
    swapped = replace_linears(
        model,
        lambda lin: (
            Nvfp4Linear.from_linear(lin) if lin.out_features == 64 else Q2Linear.from_linear(lin)
        ),
    )
    model = model.to(device)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, layer in swapped.items():
        layer.register_forward_hook(
            lambda mod, args, out, name=name: seen.__setitem__(name, (args[0], out))
        )
    x = torch.randn(2, 3, 256, device=device).to(torch.bfloat16)  # [batch, tokens, K]
    with torch.inference_mode():
        y = model(x)
    print(f"model on {device}: {tuple(x.shape)} -> {tuple(y.shape)} {y.dtype}")
    for name, layer in swapped.items():
        x_in, out = seen[name]
        want = reference_output(layer, x_in)
        got = out.cpu()
        q2gemv.assert_bits_equal(
            got.view(torch.int16).numpy().view(np.uint16),
            want.view(torch.int16).numpy().view(np.uint16),
            name,
        )
        print(
            f"layer {name}: {type(layer).__name__} {layer.in_features}->{layer.out_features}, "
            f"{got.numel()} outputs bit-equal to the reference"
        )
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
