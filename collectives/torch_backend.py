"""The registered ``torch.distributed`` backend ``ringtune``, at its documented path.

The code is ``collectives/torch/backend.py`` (the torch integration is one package). This
module stays because ``collectives.torch_backend`` was the backend's documented module
(docs/design.md) and stays a public path: jobs outside this repository may import
``RingtuneBackendMixin`` or ``register_backend`` from it (a subclass for their own process
group, a registration under another name). Importing it imports ``collectives.torch``,
which registers the backend, as before.
"""

from __future__ import annotations

from .torch.backend import (
    BACKEND_NAME,
    RingtuneBackendMixin,
    python_backends,
    register_backend,
)

__all__ = ["BACKEND_NAME", "RingtuneBackendMixin", "python_backends", "register_backend"]
