"""``cupy.cuda.nccl`` of the simulated GPU: NCCL is not installed here (as CuPy reports
when ``libnccl.so.2`` is missing), so ``nccl`` transport tests skip with that reason."""

available = False
