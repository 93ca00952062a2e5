"""torch integration: ``Q2Linear`` / ``Nvfp4Linear`` modules over q2gemv's GEMV (needs torch).

``import q2gemv`` never imports torch; ``import q2gemv.torch`` does (``pip
install "q2gemv[torch]"``). Two ``torch.nn.Module`` classes replace a
``torch.nn.Linear`` in inference:

* :class:`Q2Linear` holds a GGUF ``block_q2_0`` weight (:class:`~q2gemv.Q2Weight`);
* :class:`Nvfp4Linear` an NVFP4 W4A16 weight (:class:`~q2gemv.Nvfp4Weight`).

``forward(x)`` takes ``torch.bfloat16`` activations of shape ``[..., K]`` and
returns ``torch.bfloat16`` ``[..., N]``: ``y = x @ dequantize(W).T`` with the
bits of :func:`q2gemv.gemv` (the library's default numerics contract unless
``numerics=`` is given), then ``y = y + bias`` as one bf16 torch add when the
module has a bias (the bias is stored in bf16).

The packed weight lives in registered buffers (``raw`` for Q2_0, ``packed``
and ``scales`` for NVFP4; uint8), so ``.to("cuda")`` / ``.cuda()`` moves it
and ``state_dict()`` / ``load_state_dict()`` round-trip it; ``n``, ``k``,
``group``, ``global_scale`` and ``numerics`` are plain attributes, saved as the
module's extra state: a uint8 tensor of JSON, so a state dict is tensors only
(``safetensors``, ``save_pretrained``; docs/models_save_load.md). ``load_state_dict``
checks the buffers and the settings together before it writes a byte.
``Q2Linear.empty`` / ``Nvfp4Linear.empty`` make a layer from its shape alone (on the
meta device under ``with torch.device("meta"):``), to be filled by loading.

The GEMV is a ``torch.library`` custom op (``torch.ops.q2gemv.q2_linear``,
``torch.ops.q2gemv.nvfp4_linear``) with a fake (meta) implementation, so
modules using it trace under ``torch.compile`` (the op stays opaque: one
call per layer in the graph) and can be captured in a CUDA graph:

* CPU tensors run q2gemv's NumPy reference backend (``backend="reference"``),
  bit-identical to the GPU kernels;
* CUDA tensors run the numba kernels on torch's current stream over a device
  weight made from the buffers (``DeviceQ2Weight.from_buffers`` /
  ``DeviceNvfp4Weight.from_buffers``: no host copy; a snapshot repacked into the
  kernels' execution layout), writing into a tensor from torch's caching
  allocator. It is cached per buffer and rebuilt after a write torch records (the
  buffer's version counter or a new storage: in-place ops, ``copy_``,
  ``load_state_dict``, ``.to()``, ``.data = t``), and checked against the buffer's
  bytes once after the layer hands the buffer out (``layer.raw``,
  ``named_buffers()``, ``state_dict()``: a write through ``.data`` is not counted);
  see docs/guarantees.md (:func:`clear_device_weight_cache`).
  An eager CUDA forward calls the op's function without the dispatcher (its
  Python overhead is as long as a decode GEMV); traced and CPU calls use the op.

CUDA graphs: run each layer once on the capturing stream before the capture
(that compiles the kernels and, for the exact contract, allocates its
per-stream workspace: nothing may be allocated with ``cudaMalloc`` while
capturing).

Autograd (both devices alike): ``y`` requires a gradient when ``x`` does, and
``backward`` gives ``x`` the transposed GEMV on the dequantized weight,
``fp32(dy) @ dequantize(W)`` rounded to bf16 (torch's matmul: not part of the
bit-exact contract); the uint8 weight buffers get none. Registered with
``torch.library.register_autograd``, so ``torch.compile`` traces it.

Model level (:mod:`q2gemv.models`, re-exported here): :func:`quantize_model`,
:func:`load_gguf` / :func:`config_from_gguf`, :func:`load_safetensors`,
:func:`save_gguf` / :func:`save_safetensors` (:mod:`q2gemv.models.export`) and
:class:`CapturedDecoder` (the loaders and the decoder need transformers).

This module only re-exports: the ops and the device-weight cache live in
:mod:`q2gemv.nn.ops`, the modules in :mod:`q2gemv.nn.layers`, the model level in
:mod:`q2gemv.models`.
"""

from __future__ import annotations

from .models.decode import CapturedDecoder
from .models.export import save_gguf, save_safetensors
from .models.gguf import config_from_gguf, load_gguf
from .models.hf_hook import register_when_transformers_loads
from .models.quantize import QuantizeReport, quantize_model
from .models.safetensors import load_safetensors
from .nn.layers import Nvfp4Linear, Q2Linear, replace_linears
from .nn.ops import clear_device_weight_cache, nvfp4_linear, q2_linear

__all__ = [
    "Q2Linear",
    "Nvfp4Linear",
    "q2_linear",
    "nvfp4_linear",
    "replace_linears",
    "clear_device_weight_cache",
    "quantize_model",
    "QuantizeReport",
    "load_gguf",
    "config_from_gguf",
    "load_safetensors",
    "save_gguf",
    "save_safetensors",
    "CapturedDecoder",
]


# from_pretrained of a saved q2gemv model: register the "q2gemv" quantizer with
# transformers when transformers loads its quantizers (this import stays free of it).
register_when_transformers_loads()
