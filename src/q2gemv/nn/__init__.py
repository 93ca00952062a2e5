"""torch modules and ops over q2gemv's GEMV (needs torch); :mod:`q2gemv.torch` re-exports them.

* :mod:`.ops`: what the ``torch.library`` ops share (checks, the device-weight cache, the
  CPU/CUDA run, the gradient formula) and ``q2gemv::add_bias``;
* :mod:`.layers`: what every layer shares (``QuantizedLinear``, its tensors-only state),
  ``layer_class`` through the registry, ``replace_linears``; knows no format;
* :mod:`.q2_0`, :mod:`.nvfp4`: one module per format: its op (``q2gemv::q2_linear``,
  ``q2gemv::nvfp4_linear``, fake impl, autograd) and its layer, ``Q2Linear`` / ``Nvfp4Linear``;
* :mod:`.swap`: find a module's ``torch.nn.Linear`` layers, check every one, then swap.

Below :mod:`q2gemv.models`: nothing here imports the model level.
"""
