"""``python -m experiments.gpu_check`` (``make gpu-check``): the checks only a CUDA device can
make (host syncs, mixed-precision gradients, Ham against self-attention, the LightHamHead, one
nccl DDP step), written to docs/benchmarks_gpu.md; without CUDA it says so and exits 0. The
code is ``experiments.benchmarks.gpu``."""

from experiments.benchmarks.gpu import main

if __name__ == "__main__":
    raise SystemExit(main())
