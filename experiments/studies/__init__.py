"""No-training studies of implicit layers: the gradient and convergence studies of a configured
model (``model_studies``, behind ``experiments.grad_study`` / ``experiments.convergence``), the
task-loss gradients of the training arms, the ridge conditioning studies, the backbone
pretraining (``pretraining``, behind ``experiments.pretrain``) and the diagnostics example; and
what the studies that commit one CSV row per job share: ``csv_rows`` (the CSV and its sessions
sidecar), ``job_row`` (a job's composed config and measured row), ``job_runner`` (the resumable
scheduler) and ``provenance``. Each study has its own folder (``paper_v4``, ``generation_v3``,
``sequence_benchmarks``, ``deq_training``, ``legend_seg``)."""
