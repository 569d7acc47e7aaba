"""ringtune's tests. Every suite runs more ranks than cores on purpose on small shared
machines and checks correctness, never speed: a tune's A/B times far off its search's
(``autotune.choose.check_against_search``) are a warning here, not the stop a real tuning
run makes (its own test sets the variable it needs)."""

import os

os.environ.setdefault("RINGTUNE_TIMING_CHECK", "warn")
