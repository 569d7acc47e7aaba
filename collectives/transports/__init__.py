"""The transports built into the runtime, one module each (``mpi``, ``torch``).

Use ``collectives.registry.make_transport(name, comm, backend)`` to get one by name; the
registry also finds the transports a plug-in registers (the GPU plug-in's ``staged`` and
``nccl``). A new transport is one module with a ``Transport`` subclass that calls
``register_transport`` (from ``collectives.transports.registry``) when it is imported, and
its name added to the import line below.
"""

from __future__ import annotations

# The built-in host transports, imported explicitly: each module registers itself, and
# this line's order is the registration order (what ``transport_names`` lists, the JSON
# Schema's enums, ties of the GPU preference). Neither imports mpi4py or torch until a
# transport is made.
from . import mpi, torch  # noqa: F401
from .registry import TransportFactory, register_transport

__all__ = ["TransportFactory", "register_transport"]
