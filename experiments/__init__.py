"""The experiments of implicit-ham: Hydra entry points, the configs generated from the library,
sweep reports, the study document and the benchmarks (docs/architecture.md). Not part of the
wheel: run from a checkout with the ``experiments`` extra installed."""
