"""The search: Optuna studies over allreduce configurations (filled by the tuner work)."""
