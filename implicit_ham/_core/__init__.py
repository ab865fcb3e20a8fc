"""The core every layer builds on: states, statistics, errors, registries, argument checks,
precision and transform detection, the gradient guard and the metric-sink interface.

Private: nothing here imports another part of the library, and its public pieces are
re-exported by ``implicit_ham``, ``implicit_ham.errors`` and ``implicit_ham.plugins``.
"""
