"""The training engine behind the commands: ``run.run_training`` (one job from a typed
``TrainConfig``), the parts it builds (``build``), the trainer and its callbacks (``trainer``,
``callbacks``), checkpoints and resume (``checkpoint``, ``resume``), the batch sampler,
determinism, data parallelism, CPU sync batch norm, metrics and the metric sinks (files,
wandb)."""
