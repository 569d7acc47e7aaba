"""The transports built into the runtime, one module each (``mpi``, ``torch``).

Use ``collectives.registry.make_transport(name, comm, backend)`` to get one by name; the
registry also finds the transports a plug-in registers (the GPU plug-in's ``staged`` and
``nccl``). A new transport is one module with a ``Transport`` subclass and a
``register_transport`` line where it is loaded.
"""
