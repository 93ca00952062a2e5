"""torch modules and ops over q2gemv's GEMV (needs torch); :mod:`q2gemv.torch` re-exports them.

* :mod:`.ops`: the ``torch.library`` ops (``q2gemv::q2_linear``, ``q2gemv::nvfp4_linear``,
  ``q2gemv::add_bias``), their fake impls and autograd, the device-weight cache;
* :mod:`.layers`: what every layer shares (``QuantizedLinear``, its tensors-only state),
  ``layer_class`` through the registry, ``replace_linears``; knows no format;
* :mod:`.q2_0`, :mod:`.nvfp4`: one layer per format, ``Q2Linear`` / ``Nvfp4Linear``;
* :mod:`.swap`: find a module's ``torch.nn.Linear`` layers, check every one, then swap.

Below :mod:`q2gemv.models`: nothing here imports the model level.
"""
