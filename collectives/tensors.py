"""PyTorch tensors as allreduce buffers, without copies and without importing torch.

Use ``as_buffer(buf)`` before choosing a backend: a CPU tensor becomes the NumPy view of its
memory (``Tensor.numpy()`` shares it), a CUDA tensor is checked and passed on to the CuPy
backend (which views it through ``__cuda_array_interface__``/DLPack), anything else is
returned unchanged. The checks give one line naming the rank and the fix: a non-contiguous
tensor, a tensor that requires grad while autograd records (in-place writes to it are what
autograd forbids), or a device ringtune cannot serve.

torch is never imported here: a tensor is recognised by its type's module, so a job that
passes NumPy arrays never pays for torch (and ``import collectives`` stays light).
"""

from __future__ import annotations

from typing import Any


def is_torch_tensor(buf: Any) -> bool:
    """Whether ``buf`` is a ``torch.Tensor`` (or a subclass such as ``Parameter``)."""
    for cls in type(buf).__mro__:
        if cls.__name__ == "Tensor" and cls.__module__ == "torch":
            return True
    return False


def rank_label() -> str:
    from .mpi.launcher import launcher_rank

    return str(launcher_rank())


def check_tensor(t: Any) -> None:
    """Raise ``ValueError``/``TypeError`` (naming the rank and the fix) unless ``t`` can be
    reduced in place by ringtune: contiguous, not requiring grad while autograd records, on
    the CPU or a CUDA device."""
    import torch

    # The common case costs a few attribute reads (it runs once per allreduce of a tensor):
    # ``is_cpu``/``is_cuda`` instead of building a ``torch.device``, the rank only for a
    # message (``launcher_rank`` reads the environment).
    if (t.is_cpu or t.is_cuda) and t.layout == torch.strided and t.is_contiguous() \
            and not (t.requires_grad and torch.is_grad_enabled()):
        return
    rank = rank_label()
    kind = t.device.type
    if kind not in ("cpu", "cuda"):
        raise TypeError(f"rank {rank}: tensor on device {t.device} cannot be reduced by "
                        "ringtune (it serves CPU tensors and CUDA tensors): move it with "
                        "t.cpu() or t.cuda(), reduce, and copy the result back")
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError(f"rank {rank}: tensor has layout {t.layout}: ringtune reduces dense "
                        "tensors; pass t.to_dense()")
    if not t.is_contiguous():
        raise ValueError(f"rank {rank}: tensor of shape {tuple(t.shape)} is not contiguous "
                         f"(strides {t.stride()}): allreduce works in place on contiguous "
                         "memory; pass c = t.contiguous() and copy back with t.copy_(c)")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"rank {rank}: tensor requires grad and autograd is recording, so it "
                         "cannot be changed in place: reduce its .grad, or call allreduce "
                         "inside `with torch.no_grad():` (as optimizers update parameters)")


def _bfloat16() -> Any:
    import torch

    return torch.bfloat16


def as_buffer(buf: Any) -> Any:
    """What the backends can take for ``buf``: a CPU tensor's NumPy view (same memory), a
    checked CUDA tensor (a detached alias when it requires grad under ``no_grad``, since
    ``__cuda_array_interface__`` refuses such tensors), or ``buf`` itself."""
    if not is_torch_tensor(buf):
        return buf
    check_tensor(buf)
    t = buf.detach() if buf.requires_grad else buf  # same memory, no autograd
    if t.is_cpu:
        if t.dtype is _bfloat16():
            import numpy as np

            # NumPy has no bfloat16; ml_dtypes gives the same bits a NumPy name.
            try:
                import ml_dtypes
            except ImportError:
                raise TypeError(f"rank {rank_label()}: CPU bfloat16 tensors need ml_dtypes "
                                "(pip install ml_dtypes), or pass t.float()") from None
            import torch

            return t.view(torch.int16).numpy().view(np.dtype(ml_dtypes.bfloat16))
        return t.numpy()
    import torch

    # The GPU backend orders its stream after CuPy's current stream (the legacy default
    # stream, torch's default too). Kernels queued on a torch side stream are not in that
    # order: wait for them here, or the reduction could read the tensor before they ran.
    stream = torch.cuda.current_stream(t.device)
    if stream.cuda_stream != torch.cuda.default_stream(t.device).cuda_stream:
        stream.synchronize()
    return t
