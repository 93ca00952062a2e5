"""torch integration: ``Q2Linear`` / ``Nvfp4Linear`` modules over q2gemv's GEMV (needs torch).

``import q2gemv`` never imports torch; ``import q2gemv.torch`` does. :class:`Q2Linear`
(a GGUF ``block_q2_0`` weight) and :class:`Nvfp4Linear` (NVFP4 W4A16) replace a
``torch.nn.Linear`` in inference: ``forward(x)`` maps bf16 ``[..., K]`` to bf16
``[..., N]`` with the bits of :func:`q2gemv.gemv` (the default contract unless
``numerics=`` is given), then adds the bias (stored in bf16) as one bf16 add. Usage,
graph captures and autograd: ``docs/torch.md``.

State: the packed weight is in uint8 buffers (``raw``; ``packed`` and ``scales``), so
``.to()`` moves it and ``state_dict()`` round-trips it; ``n``, ``k``, ``group``,
``global_scale`` and ``numerics`` are extra state (a uint8 tensor of JSON), so a state
dict is tensors only (docs/models_save_load.md). ``load_state_dict`` checks buffers and
settings together before it writes a byte; ``.empty`` makes a layer from its shape alone
(on the meta device under ``with torch.device("meta"):``).

The GEMV is a ``torch.library`` custom op (``torch.ops.q2gemv.q2_linear``,
``torch.ops.q2gemv.nvfp4_linear``) with a fake implementation: opaque under
``torch.compile``, capturable in a CUDA graph after one warm-up call on the capturing
stream (it compiles the kernels and allocates the exact contract's workspace). CPU
tensors run the NumPy reference; CUDA tensors run the kernels on torch's current stream
over a device weight made from the buffers (``from_buffers``: no host copy), cached per
buffer and rebuilt after a write torch records (version counter or new storage), and
re-checked against the bytes once after the layer hands a buffer out (docs/guarantees.md,
:func:`clear_device_weight_cache`). An eager CUDA forward skips the dispatcher (its
Python overhead is as long as a decode GEMV). ``backward`` gives ``x`` the transposed
GEMV on the dequantized weight (torch's matmul, not bit-exact), the weights none.

Model level (:mod:`q2gemv.models`, re-exported here): :func:`quantize_model`,
:func:`load_gguf`, :func:`config_from_gguf`, :func:`load_safetensors`, :func:`save_gguf`,
:func:`save_safetensors` and :class:`CapturedDecoder`.

This module only re-exports: each format's op and layer live in :mod:`q2gemv.nn.q2_0` and
:mod:`q2gemv.nn.nvfp4`, the device-weight cache in :mod:`q2gemv.nn.ops`, the shared layer
machinery in :mod:`q2gemv.nn.layers`, the model level in :mod:`q2gemv.models`.
"""

from __future__ import annotations

from .models.decode import CapturedDecoder
from .models.export import save_gguf, save_safetensors
from .models.gguf import config_from_gguf, load_gguf
from .models.hf_hook import register_when_transformers_loads
from .models.quantize import QuantizeReport, quantize_model
from .models.safetensors import load_safetensors
from .nn.layers import replace_linears
from .nn.nvfp4 import Nvfp4Linear, nvfp4_linear
from .nn.ops import clear_device_weight_cache
from .nn.q2_0 import Q2Linear, q2_linear

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
