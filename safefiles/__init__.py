"""Files read and written safely: declared records and their validation, the bounded YAML
reader, atomic writes that never replace what is not ours.

The bottom layer: every other package (probes, collectives, autotune, ringtune) reads and
writes its files through these modules, and they import none of them.

- ``safefiles.records``: frozen dataclasses declare a file's records; one generic pass
  checks plain data against a declaration and writes its JSON Schema.
- ``safefiles.safeload``: the one bounded loader (regular files, size cap, YAML subset).
- ``safefiles.outfile``: the one output writer (atomic replace; never over what is not ours).
- ``safefiles.numbers``: numbers from files and the environment, finite and in range.
"""
