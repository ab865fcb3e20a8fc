"""Matrix decompositions as implicit layers: the base class, the registry and the built-ins.

Built-ins: ``NMF``, ``VQ``, ``CD`` (Hamburger's three), ``SVD`` (subspace iteration) and
``NormalizedNMF`` (NMF without its scaling symmetry), ``RidgeNMF`` (ridge-regularised NMF
as an argmin, by projected gradient) and ``RidgeCD`` (CD's soft spherical k-means with the
sphere replaced by a ridge, by gradient steps), the last four added through the public plug-in
API only. A layer's keywords are checked into the frozen ``DecompositionOptions`` (the union of
``IterationOptions``, ``LayoutOptions`` and ``BasesOptions``), kept as its ``options``.
"""

from implicit_ham.decompositions.base import Decomposition
from implicit_ham.decompositions.cd import CD
from implicit_ham.decompositions.cd_ridge import RidgeCD
from implicit_ham.decompositions.initial_bases import InitialBases
from implicit_ham.decompositions.nmf import NMF
from implicit_ham.decompositions.nmf_normalized import NormalizedNMF
from implicit_ham.decompositions.nmf_ridge import RidgeNMF
from implicit_ham.decompositions.options import (
    BasesOptions,
    DecompositionOptions,
    IterationOptions,
    LayoutOptions,
)
from implicit_ham.decompositions.registry import (
    DECOMPOSITIONS,
    DecompositionRegistry,
    make_decomposition,
    register_decomposition,
)
from implicit_ham.decompositions.svd import SVD
from implicit_ham.decompositions.vq import VQ

__all__ = [
    "CD",
    "DECOMPOSITIONS",
    "NMF",
    "SVD",
    "VQ",
    "BasesOptions",
    "Decomposition",
    "DecompositionOptions",
    "DecompositionRegistry",
    "InitialBases",
    "IterationOptions",
    "LayoutOptions",
    "NormalizedNMF",
    "RidgeCD",
    "RidgeNMF",
    "make_decomposition",
    "register_decomposition",
]
