"""The benchmarks behind `python -m experiments.bench`: blocks, adjoints, compiled, diagnostics,
peers, the GPU check, the page writer and the measuring tools they share."""
