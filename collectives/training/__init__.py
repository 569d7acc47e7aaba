"""Helpers for training jobs: many buffers at once and communication off the training thread.

- ``fusion``: ``Communicator.allreduce_many``, small buffers packed into buckets of a tuned
  size, each bucket reduced once.
- ``exchange``: one communication thread per ``Communicator`` that makes its MPI calls, so
  the training thread computes while buckets are reduced (the DDP hook, the torch backend
  and ``allreduce_many`` submit to it).
"""
