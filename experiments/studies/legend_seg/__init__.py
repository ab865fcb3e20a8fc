"""The legend_seg studies of ``docs/results.md`` (run by ``experiments/scripts/study.sh``):
``report`` (the document from the study folder, with the paper-regime block of
``experiments.studies.paper_v3``) and its sections (``stress``, ``gradients`` + ``task_grad``,
``baselines``, ``convergence``, ``ridge``; ``data``, ``plots``), its templates in
``templates/study/``."""
