"""What is specific to MPI and its launchers, apart from the algorithms that run over it.

- ``launcher``: what mpiexec, srun or torchrun tell a process through its environment (its
  rank, the world size, its host's ranks), readable before or without MPI.
- ``mpilib``: loading the MPI library (one line saying what to install where none loads)
  and naming the family of a library or an ``mpiexec``.
- ``mpit``: MPI_T control variables through ctypes, for any MPI library.

Importing this package loads nothing: ``import collectives`` reads the launcher's variables
and must not load mpi4py's ``MPI`` module.
"""
