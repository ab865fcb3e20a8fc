"""The peer benchmarks: implicit-ham against torchdeq, TorchOpt, Theseus, SciPy and the official
Hamburger code (``run.py``; ``venvs.sh`` builds the peers' own virtualenvs)."""
