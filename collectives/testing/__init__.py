"""The contract suites, shipped so that a plug-in runs the tests the built-ins pass (as
Optuna ships ``optuna.testing``): import the module you need, nothing is imported here.

- ``collectives.testing.contract``: the allreduce contract, for algorithms (and for a
  transport or MPI library underneath them): ``configs``, ``run_configs``, ``check_one``,
  ``communicator_of``, ``Setup``.
- ``collectives.testing.transport_contract``: the transport contract (``CHECKS``, ``run``,
  ``runnable``, ``Setup``).
- ``collectives.testing.results``: the closed-form check of an allreduce result
  (``check_input``, ``mismatches``, ``disagreement``).

``import collectives`` never imports this package; pytest is imported only by the helpers
that make fixtures or skip (``contract.kind_comm_fixture``, ``transport_contract.run``).
How to call them: CONTRIBUTING.md, "Run the contract on your plug-in".
"""
