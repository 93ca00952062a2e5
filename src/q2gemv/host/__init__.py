"""Host-side machinery between the API and the kernels.

* :mod:`.backends`: which backends this process has (reference, cuda, simulator).
* :mod:`.arrays`: device arrays and streams as callers pass them, the launch cache key.
* :mod:`.device`: device-resident weights (``to_device``, the ``DeviceWeight`` protocol).
* :mod:`.prepared`: activations converted once (``q2gemv.prepare``).
"""
