"""The search: ``ringtune tune``'s Optuna studies over allreduce configurations, the cost
model behind ``ringtune simulate`` and the warm start, and the profile they write.

Use ``autotune.tuning.tune`` for a whole run (collective over a communicator),
``autotune.model`` to predict a cluster, ``autotune.choose`` for the A/B choice.
"""
