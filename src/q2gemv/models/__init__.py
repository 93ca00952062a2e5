"""Model-level torch integration (needs torch; the loaders and the decoder need transformers).

* :mod:`.quantize`: :func:`quantize_model`;
* :mod:`.fuse`: q/k/v and gate/up as one quantized layer each (``FusedSlice`` members);
* :mod:`.gguf`: :func:`load_gguf`, :func:`config_from_gguf` (llama.cpp GGUF files);
* :mod:`.safetensors`: :func:`load_safetensors` (NVFP4 ModelOpt / compressed-tensors);
* :mod:`.decode`: :class:`CapturedDecoder` (static KV cache, one CUDA graph per batch size);
* :mod:`.saved`: the ``quantization_config`` a quantized model carries, empty layers to load into;
* :mod:`.hf`: the ``"q2gemv"`` transformers quantizer (``from_pretrained`` of a saved model),
  registered by :mod:`.hf_hook` when transformers loads its quantizers.

Built on the layers of :mod:`q2gemv.nn` (the Linear swap is :mod:`q2gemv.nn.swap`); never
imports :mod:`q2gemv.torch`, which re-exports the public names.
"""
