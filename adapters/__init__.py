"""ZeroBatch framework adapters: import the submodule for your framework.

``zerobatch_adapters.torch`` (PyTorch), ``zerobatch_adapters.jax`` (JAX) and
``zerobatch_adapters.tensorflow`` (``tf.data``) each import their framework; this package
imports none, and everything they share lives in ``zerobatch_core``.
"""
