"""``python -m experiments.studies.paper_v3``: the runner (``run.main``)."""

from experiments.studies.paper_v3.run import main

if __name__ == "__main__":
    main()
