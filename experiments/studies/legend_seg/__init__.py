"""The legend_seg studies of ``docs/results.md`` (run by ``experiments/scripts/study.sh``):
``report`` (the document from the study folder, with study v3's static history as
section 1) and its sections (``stress``, ``gradients`` + ``task_grad``,
``baselines``, ``convergence``, ``ridge``; ``data``, ``plots``), its templates in
``templates/study/``."""
