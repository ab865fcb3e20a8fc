"""BatchNorm with statistics over the global batch of all processes.

On CUDA ``convert_batchnorm`` uses PyTorch's ``nn.SyncBatchNorm`` (fused kernels). PyTorch's
version refuses CPU tensors, so on the CPU (``gloo``) the BatchNorm layers become
``AllReduceBatchNorm``: per-channel sums are all-reduced through an autograd function whose
backward all-reduces the incoming gradient, which is exactly the gradient of BatchNorm on the
concatenated batch once DistributedDataParallel averages the parameter gradients.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class _AllReduceSum(torch.autograd.Function):
    """Sum over processes in forward; sum of the incoming gradients in backward."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, tensor: Tensor) -> Tensor:
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)
        return out


class AllReduceBatchNorm(_BatchNorm):
    """BatchNorm over inputs (N, C, ...) whose training statistics are those of the batch
    concatenated over all processes (mean and biased variance for normalising, unbiased
    variance for the running estimate, as ``nn.BatchNorm``). In evaluation mode, or in a single
    process, it is the ordinary BatchNorm."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"AllReduceBatchNorm expects (N, C, ...) input, got {input.dim()}-D")

    def forward(self, input: Tensor) -> Tensor:
        """input (N, C, ...) -> normalised input, same shape."""
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if not (self.training and distributed):
            return super().forward(input)
        self._check_input_dim(input)
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        local_count = input.new_full((1,), input.numel() / input.shape[1])
        totals = _AllReduceSum.apply(torch.cat([input.sum(dims), local_count]))
        count = totals[-1].detach()
        mean = totals[:-1] / count
        centred = input - mean.reshape(shape)
        var = _AllReduceSum.apply(centred.square().sum(dims)) / count
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(count))
        scale = torch.rsqrt(var + self.eps)
        out = centred * scale.reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def _update_running_stats(self, mean: Tensor, var: Tensor, count: float) -> None:
        tracked = cast(Tensor, self.num_batches_tracked)  # buffers exist: track_running_stats
        running_mean, running_var = cast(Tensor, self.running_mean), cast(Tensor, self.running_var)
        with torch.no_grad():
            tracked.add_(1)
            factor = 1.0 / float(tracked) if self.momentum is None else float(self.momentum)
            unbiased = var * (count / max(count - 1.0, 1.0))
            running_mean.lerp_(mean.to(running_mean.dtype), factor)
            running_var.lerp_(unbiased.to(running_var.dtype), factor)


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm synchronised across processes: ``nn.SyncBatchNorm`` when
    its parameters are on CUDA, ``AllReduceBatchNorm`` otherwise (parameters and running
    statistics are the same tensors, so an optimiser built before keeps working; the state-dict
    keys are unchanged)."""
    first = next(module.parameters(), None)
    if first is not None and first.device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _replace_batchnorm(module)


def _replace_batchnorm(module: nn.Module) -> nn.Module:
    if isinstance(module, _BatchNorm) and not isinstance(
        module, (AllReduceBatchNorm, nn.SyncBatchNorm)
    ):
        replacement = AllReduceBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        if module.affine:
            replacement.weight, replacement.bias = module.weight, module.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            setattr(replacement, name, getattr(module, name))
        replacement.train(module.training)
        return replacement
    for name, child in module.named_children():
        module.add_module(name, _replace_batchnorm(child))
    return module
