"""The profile document: the one builder of the mapping a profile file holds.

``ringtune tune`` (``autotune.choose.build_profile``), online tuning
(``collectives.online.document``) and ``Profile.to_dict`` all assemble their document here:
``profile_document(base, **keys)`` takes a document to start from (a loaded file's, kept as
it is) and the keys to set, writes the format's name and version (``profile_format``:
never spelled elsewhere) and puts the keys in the written order. ``written_by(created)``
is the ``created`` and ``tool`` header of a document ringtune measured; ``utc_now`` the
time stamps' form. Plain data in, plain data out: ``write_profile`` validates it (as the
``ProfileRecord`` the runtime reads) before a byte is written.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from typing import Any

from .constants import FORMAT, VERSION

#: Key order of written files (people read them); keys not listed (``shapes``) follow.
KEY_ORDER = ("format", "version", "created", "tool", "library", "engine", "topology",
             "backend", "transport", "dtype", "op", "rules", "fusion", "tuning", "extra")


def profile_document(base: Mapping[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    """A profile document: ``base``'s keys (none: a new document), then ``keys`` set
    (a key given as ``None`` is left out, or taken out of ``base``), the format's name and
    version, in ``KEY_ORDER``. Nested values are kept as given (their key order is the
    file's, or the builder's)."""
    out: dict[str, Any] = dict(base or {})
    out.update(format=FORMAT, version=VERSION)
    for key, value in keys.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return ordered(out)


def written_by(created: str) -> dict[str, Any]:
    """The header of a document ringtune measured: when (``created``), and which ringtune
    (``tool``)."""
    return {"created": created, "tool": {"name": "ringtune", "version": _version()}}


def utc_now() -> str:
    """Now, in UTC, to the second (``2026-12-06T05:55:12Z``): the documents' time stamps."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(
    ).replace("+00:00", "Z")


def ordered(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with its keys in ``KEY_ORDER``, any others after, as they came."""
    out = {k: data[k] for k in KEY_ORDER if k in data}
    out.update((k, v) for k, v in data.items() if k not in out)
    return out


def plain(obj: Any) -> Any:
    """Plain YAML/JSON types (tuples → lists, NumPy scalars → Python numbers)."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def _version() -> str:
    # The package's version, read from the package already imported (importing it here
    # would make a cycle: the package imports the communicator, which imports this).
    return str(getattr(sys.modules.get("collectives"), "__version__", "unknown"))
