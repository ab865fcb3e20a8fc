"""No-training studies of implicit layers: the gradient and convergence studies of a configured
model (``model_studies``, behind ``experiments.grad_study`` / ``experiments.convergence``), the
task-loss gradients of the training arms, the ridge conditioning studies, the backbone
pretraining (``pretraining``, behind ``experiments.pretrain``) and the diagnostics example."""
