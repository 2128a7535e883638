"""``pypto.runtime.distributed_runner``: the L3 worker, and turning a sub-worker's tensor argument into a tensor.

PyPTO hands a sub-worker callback its tensors as descriptors of device-visible memory, which
``_tensor_from_continuous`` turns into a torch tensor; ptodist hands it the host tensor itself (the caller's
torch tensor or numpy array), so the conversion is a view, never a copy: writes through it reach the argument.
"""

from __future__ import annotations

from ..errors import ApiTypeError
from .worker import DistributedWorker


def _tensor_from_continuous(tensor):
    """A torch view of a sub-worker's tensor argument (``args.tensor(i)``): the tensor itself, or a numpy array
    wrapped without copying."""
    import torch

    if isinstance(tensor, torch.Tensor):
        return tensor
    if hasattr(tensor, "__array_interface__"):
        return torch.from_numpy(tensor)
    raise ApiTypeError(f"_tensor_from_continuous({type(tensor).__name__}): expects a sub-worker's tensor argument "
                       "(args.tensor(i)), a torch tensor or a numpy array")


__all__ = ["DistributedWorker"]
