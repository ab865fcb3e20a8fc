"""Study v3, the paper's regime on real digits (the v3 section of ``docs/results.md``): ``plan``
(stages and selection), ``run`` (the runner, also ``python -m experiments.studies.paper_v3``),
``eval`` and ``table`` (a job's measurements and its CSV row), ``report`` (the section's data),
``budget`` and ``length``, ``page`` (the section from the CSV, ``page.md.j2``)."""
