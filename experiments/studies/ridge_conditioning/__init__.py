"""The ridge hams' conditioning measurements of ``docs/optimization_layers.md``: ``nmf``
(``python -m experiments.studies.ridge_conditioning.nmf``) and ``cd``."""
