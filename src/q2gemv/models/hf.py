"""transformers integration: ``from_pretrained`` of a saved q2gemv model (needs transformers).

:func:`register` registers ``"q2gemv"`` through transformers' public quantizer hook:
:class:`Q2gemvConfig` (the ``quantization_config``) and :class:`Q2gemvHfQuantizer`
(empty q2gemv layers on the meta device, filled from the checkpoint; a layer whose state
is missing is a ``ValueError``). ``import q2gemv.torch`` arranges the registration
(:mod:`q2gemv.models.hf_hook`). How and why:
docs/models_save_load.md#loading-the-transformers-integration-and-why-this-one.
"""

from __future__ import annotations

from typing import Any

from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..nn.layers import QuantizedLinear
from .saved import QUANT_METHOD, check_config, replace_with_empty_layers, unloaded_layers


class Q2gemvConfig(QuantizationConfigMixin):
    """The ``quantization_config`` of a q2gemv model (fields: docs/models_save_load.md).

    Args (every one optional, as in ``config.json``): ``format`` (``"q2_0"``, ``"nvfp4"``),
    ``group`` (64/128 for Q2_0, None for NVFP4), ``numerics``, ``modules_to_not_convert``
    (exact qualified names of the Linears kept in floating point), ``fused_projections``
    (the members of each fused layer, :mod:`q2gemv.models.fuse`), ``version``, ``quant_method``. Unknown keys, another version or
    a value the format refuses raise ``ValueError``.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(check_config(kwargs))

    def to_dict(self) -> dict[str, Any]:
        return check_config(dict(self.__dict__))


class Q2gemvHfQuantizer(HfQuantizer):
    """Loads a checkpoint saved from q2gemv layers into a model built on the meta device."""

    requires_calibration = True  # pre-quantized checkpoints only: quantize with quantize_model
    quantization_config: Q2gemvConfig

    def _process_model_before_weight_loading(self, model, **kwargs) -> None:
        replace_with_empty_layers(model, self.quantization_config.to_dict())

    def _process_model_after_weight_loading(self, model, **kwargs):
        left = unloaded_layers(model)
        if left:
            raise ValueError(
                f"checkpoint: no q2gemv state for {len(left)} layer(s) of the model "
                f"({left[:8]}); was it saved from this model's quantize_model output?"
            )
        missing = _buffers_not_loaded(model)
        if missing:
            raise ValueError(
                f"checkpoint: no tensor for {len(missing)} q2gemv buffer(s) ({missing[:8]}): "
                "transformers left them uninitialized"
            )
        return model

    def is_serializable(self, **kwargs) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def _buffers_not_loaded(model) -> list[str]:
    """The q2gemv layers' buffers that transformers did not load from the checkpoint.

    transformers marks every tensor it loads ``_is_hf_initialized`` and makes a missing
    one with ``torch.empty_like`` (a warning in its load report, undefined bytes here).
    Counted only when it marked some q2gemv buffer, so another transformers that marks
    nothing refuses nothing.
    """
    marked, unmarked = 0, []
    for name, mod in model.named_modules():
        if isinstance(mod, QuantizedLinear):
            for bname, buf in mod.named_buffers(recurse=False):
                if getattr(buf, "_is_hf_initialized", False):
                    marked += 1
                else:
                    unmarked.append(f"{name}.{bname}")
    return unmarked if marked else []


def register() -> None:
    """Register ``"q2gemv"`` with transformers (idempotent; another class there is refused)."""
    for mapping, cls, reg in (
        (AUTO_QUANTIZATION_CONFIG_MAPPING, Q2gemvConfig, register_quantization_config),
        (AUTO_QUANTIZER_MAPPING, Q2gemvHfQuantizer, register_quantizer),
    ):
        have = mapping.get(QUANT_METHOD)
        if have is None:
            reg(QUANT_METHOD)(cls)
        elif (have.__module__, have.__qualname__) == (cls.__module__, cls.__qualname__):
            mapping[QUANT_METHOD] = cls  # this module imported again (importlib.reload)
        else:
            raise ValueError(
                f"transformers already maps {QUANT_METHOD!r} to {have.__module__}."
                f"{have.__qualname__}"
            )


register()
