"""Small utilities the package shares, knowing nothing of kernels or formats.

* :mod:`.atomic`: the one way the package writes a file (temporary file, then rename).
* :mod:`.command`: what the command-line entry points share (error text, argument types).
* :mod:`.progress`: progress on long model-level work.
"""
