"""The bounded reader of every YAML and JSON file ringtune reads: profiles, topology files,
cluster and workload files.

Use ``load_file(path, what)`` for a file and ``parse_text(text, source)`` for text already
in memory. Both return plain data only — ``dict`` with ``str`` keys, ``list``, ``str``,
``int``, ``float``, ``bool``, ``None`` — or raise ``InputError`` (a ``ValueError``) with one
line ``FILE: line N: what is wrong``. The format checks of each kind of file come after, in
its own module; this one guarantees that nothing a file says can make reading it slow,
large, ambiguous or dependent on the Python process:

- size: at most ``MAX_BYTES``, checked before the file is read whole;
- values: at most ``MAX_NODES`` scalars and collections *with aliases expanded*, counted
  while parsing: an alias bomb (nine levels of nine aliases, 9⁹ values from 200 bytes) is
  refused at the alias that crosses the limit, before anything is expanded or copied;
  a recursive alias is refused;
- depth: at most ``MAX_DEPTH`` nested collections;
- duplicate mapping keys are refused (YAML would silently keep the last one: a second
  ``rules:`` would replace the table), naming the key and its line;
- only plain types: explicit tags other than ``!!str !!int !!float !!bool !!null !!seq
  !!map`` (``!!set``, ``!!binary``, ``!!timestamp``, ``!!python/...``, ``!custom``) and merge
  keys (``<<``) are refused; keys must be text; an unquoted date stays text (it would
  otherwise become a ``datetime`` object, which hashes and compares differently);
- numbers: floats finite (``.inf``/``.nan`` refused), integers within 64 bits (signed or
  unsigned).

The events come from libyaml (``yaml.CParser``) when PyYAML was built with it, else from
PyYAML's pure-Python parser; either way the values are built here from the event stream,
with the bounds checked as each event arrives, so no node tree is kept (the tree of a
13 MB profile is ~1 GB of Python objects). The collector is paused while building: the
objects built are all kept, and scanning them again and again as they grow made loading
quadratic-looking.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import stat
from collections.abc import Callable
from typing import Any

#: Largest file read (bytes), for kinds without a cap of their own (a profile has 1 MiB, a
#: topology 4 MiB, a cluster 1 MiB).
MAX_BYTES = 32 << 20
#: Most scalars + collections in one document, aliases expanded (a kind may cap lower:
#: ``load_file(max_nodes=...)``).
MAX_NODES = 4_000_000
#: Deepest nesting of collections (the formats need 5; ``extra`` gets the rest).
MAX_DEPTH = 32
#: Integers must fit 64 bits, signed or unsigned (NVML answers hold unsigned masks); each
#: format bounds its own fields further.
MIN_INT = -(1 << 63)
MAX_INT = (1 << 64) - 1

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_SEQ, _MAP = _TAG + "seq", _TAG + "map"
_SCALAR_TAGS = {_STR, _INT, _FLOAT, _BOOL, _NULL}


class InputError(ValueError):
    """A file cannot be read within the bounds, or is not plain YAML/JSON; the message is
    one line starting with the file name (and the line, when known)."""


# -- reading -------------------------------------------------------------------------------


def read_bounded(path: str | os.PathLike[str], what: str = "input",
                 max_bytes: int = MAX_BYTES, missing: str | None = None) -> str:
    """The text of ``path`` (UTF-8), refusing before reading it whole when it is larger
    than ``max_bytes``. ``missing``: the message (after ``FILE: ``) for a file that does not
    exist; default ``cannot read WHAT file: no such file``.

    Only regular files are read: the path is looked at (``stat``) before it is opened, so a
    FIFO without a writer, a device or a socket is refused at once instead of blocking or
    streaming forever; it is opened non-blocking and looked at again, so a file swapped for
    a FIFO in between cannot block either. An empty path is an error."""
    name = os.fspath(path)
    if not name:
        raise InputError(f"<empty path>: no {what} file given (the path is empty); give "
                         "the file's path")
    try:
        _check_regular(name, os.stat(name).st_mode, what)
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            _check_regular(name, st.st_mode, what)
            if st.st_size > max_bytes:
                raise InputError(f"{name}: {st.st_size} bytes is more than a {what} file may "
                                 f"have ({max_bytes} bytes); is this the right file?")
            # A file growing while it is read: one byte past the limit tells.
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(f"{name}: {missing or f'cannot read {what} file: no such file'}") \
            from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read {what} file: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{name}: more than {max_bytes} bytes, the most a {what} file may "
                         "have; is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not a text (UTF-8) file: {exc.reason} at byte "
                         f"{exc.start}") from None


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_regular(name: str, mode: int, what: str) -> None:
    """``InputError`` unless ``mode`` is a regular file's."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise InputError(f"{name}: is a directory, not a {what} file")
    kind = next((k for test, k in _SPECIAL if test(mode)), "not a regular file")
    raise InputError(f"{name}: is {kind}, not a regular {what} file; save the {what} to a "
                     "file and give its path")


def load_file(path: str | os.PathLike[str], what: str = "input",
              max_bytes: int = MAX_BYTES, missing: str | None = None,
              as_json: bool | None = None, max_nodes: int = MAX_NODES) -> Any:
    """Read and parse ``path`` within the bounds (see the module docstring). ``what`` names
    the kind of file in messages; ``as_json``: parse as JSON (default: when the name ends
    in ``.json``); ``max_nodes``: a kind's own cap on values (counted while parsing, so a
    file far over it is refused after reading that many, not all of it)."""
    name = os.fspath(path)
    text = read_bounded(name, what, max_bytes, missing)
    if as_json is None:
        as_json = name.endswith(".json")
    return parse_json(text, name, max_nodes) if as_json else parse_text(text, name, max_nodes)


# -- which kind of file --------------------------------------------------------------------

#: kind -> (what tells it apart, what the file is for)
_KINDS = {
    "profile": ("format: ringtune-profile", "give it to `ringtune show`/`validate`, or to a "
                "job as RINGTUNE_PROFILE"),
    "topology": ("format: ringtune-topology", "give it to `ringtune probe --topology`, or as "
                 "RINGTUNE_TOPOLOGY"),
    "cluster": ("levels and memory_gbs", "give it to `ringtune simulate --cluster`"),
    "workload": ("gradient_bytes and compute_seconds",
                 "give it to `ringtune simulate --workload`"),
}


def file_kind(data: Any) -> str | None:
    """Which kind of ringtune file ``data`` (parsed) looks like: ``"profile"``,
    ``"topology"``, ``"cluster"``, ``"workload"``, or ``None``. Used to say "this is a
    topology file, not a profile" instead of complaining about its first key."""
    if not isinstance(data, dict):
        return None
    fmt = data.get("format")
    if fmt == "ringtune-profile" or "rules" in data and "backend" in data:
        return "profile"
    if fmt == "ringtune-topology" or "hosts" in data and isinstance(data["hosts"], list):
        return "topology"
    if "levels" in data and "memory_gbs" in data:
        return "cluster"
    if "gradient_bytes" in data and "compute_seconds" in data:
        return "workload"
    return None


def check_kind(data: Any, expected: str, source: str) -> None:
    """``InputError`` when ``data`` is recognisably another kind of ringtune file than
    ``expected`` (one of the kinds of ``file_kind``)."""
    kind = file_kind(data)
    if kind is not None and kind != expected:
        tell, use = _KINDS[kind]
        raise InputError(f"{source}: this is a {kind} file ({tell}), not a {expected} "
                         f"file; {use}")


# -- YAML ----------------------------------------------------------------------------------


def parse_text(text: str, source: str = "<input>", max_nodes: int = MAX_NODES,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse one YAML document into plain data within the bounds; ``None`` for an empty
    document. ``InputError`` naming ``source`` and the line otherwise. Every file goes
    through libyaml's event stream (what PyYAML's safe loader parses): what it refuses as
    YAML is refused here, whatever the file's line endings."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_events(text, source, max_nodes, max_depth)
    finally:
        if enabled:
            gc.enable()


def _parse_events(text: str, source: str, max_nodes: int, max_depth: int,
                  builder: _Builder | None = None) -> Any:
    """The general reader: plain data built from libyaml's (or PyYAML's) event stream."""
    import yaml

    parser = _parser(text)
    try:
        return (builder or _Builder(source, max_nodes, max_depth)).run(parser)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{source}: {where}not valid YAML ({problem}); is the file "
                         "truncated or hand-edited?") from None
    finally:
        if hasattr(parser, "dispose"):
            parser.dispose()


def _parser(text: str) -> Any:
    import yaml

    if yaml.__with_libyaml__:
        from yaml._yaml import CParser

        return CParser(text)  # libyaml: ~10x faster than the Python parser
    else:
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        class _PyParser(Reader, Scanner, Parser):
            def __init__(self, stream: str) -> None:
                Reader.__init__(self, stream)
                Scanner.__init__(self)
                Parser.__init__(self)

        return _PyParser(text)


def _implicit_resolvers() -> dict[str, list[tuple[str, re.Pattern[str]]]]:
    """PyYAML's YAML 1.1 implicit resolvers (what ``safe_load`` uses), less timestamps."""
    from yaml.resolver import Resolver

    out: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
    for first, items in Resolver.yaml_implicit_resolvers.items():
        kept = [(tag, rx) for tag, rx in items if tag != _TAG + "timestamp"]
        if kept:
            out[first or ""] = kept
    return out


_RESOLVERS: dict[str, list[tuple[str, re.Pattern[str]]]] | None = None
_DECIMAL = re.compile(r"-?[0-9]+\.[0-9]+\Z")
_BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}


class _Builder:
    """Plain data from a stream of YAML events, bounds checked at every event.

    A frame is ``[container, key_or_NOKEY, nodes_at_start, height, anchor]``; ``key`` is
    ``_NOKEY`` in sequences and in a mapping waiting for its next key.
    """

    def __init__(self, source: str, max_nodes: int, max_depth: int) -> None:
        global _RESOLVERS
        if _RESOLVERS is None:
            _RESOLVERS = _implicit_resolvers()
        self.resolvers = _RESOLVERS
        self.source = source
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.nodes = 0
        #: anchor -> (value, expanded nodes, height); ``None`` while its node is open.
        self.anchors: dict[str, tuple[Any, int, int] | None] = {}
        self.cache: dict[str, Any] = {}
        from yaml.constructor import SafeConstructor

        self.ctor = SafeConstructor()

    def fail(self, event: Any, message: str) -> Any:
        mark = getattr(event, "start_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InputError(f"{self.source}: {where}{message}")

    def run(self, parser: Any) -> Any:
        from yaml import events as ev

        # The loop runs once per event (up to MAX_NODES of them): names are local and
        # the common case (a plain scalar seen before) is a dictionary hit.
        scalar_t, alias_t = ev.ScalarEvent, ev.AliasEvent
        seq_t, map_t = ev.SequenceStartEvent, ev.MappingStartEvent
        seq_end_t, map_end_t = ev.SequenceEndEvent, ev.MappingEndEvent
        doc_start_t, doc_end_t, stream_end_t = (ev.DocumentStartEvent, ev.DocumentEndEvent,
                                                ev.StreamEndEvent)
        get_event = parser.get_event
        cache_get = self.cache.get
        anchors = self.anchors
        max_nodes, max_depth = self.max_nodes, self.max_depth
        stack: list[list[Any]] = []
        documents = 0
        root: Any = None
        nokey = _NOKEY
        nodes = 0
        height = 0
        while True:
            event = get_event()
            t = type(event)
            if t is scalar_t:
                nodes += 1
                if event.tag is None and event.implicit[0]:
                    value = cache_get(event.value, nokey)
                    if value is nokey:
                        value = self.plain(event)
                else:
                    value = self.tagged(event)
                if event.anchor is not None:
                    anchors[event.anchor] = (value, 1, 0)
                height = 0
            elif t is map_t or t is seq_t:
                nodes += 1
                if nodes > max_nodes:
                    self._too_many(event)
                if len(stack) >= max_depth:
                    self.fail(event, f"nested more than {max_depth} levels deep; no "
                                     "ringtune file needs that")
                tag = event.tag
                if tag is not None and tag != "!" and tag != (_SEQ if t is seq_t else _MAP):
                    self._bad_tag(event, tag)
                if event.anchor is not None:
                    anchors[event.anchor] = None
                stack.append([[] if t is seq_t else {}, nokey, nodes, 1, event.anchor])
                continue
            elif t is map_end_t or t is seq_end_t:
                if nodes > max_nodes:
                    self._too_many(event)
                frame = stack.pop()
                value, height = frame[0], frame[3]
                if frame[4] is not None:
                    anchors[frame[4]] = (value, nodes - frame[2] + 1, height)
            elif t is alias_t:
                self.nodes = nodes
                value, size, height = self.alias(event, len(stack))
                nodes += size
            elif t is doc_start_t:
                documents += 1
                if documents > 1:
                    self.fail(event, "a second YAML document ('---'); a ringtune file is "
                                     "one document")
                continue
            elif t is stream_end_t:
                self.nodes = nodes
                return root
            else:  # stream start, document end
                if t is doc_end_t:
                    anchors.clear()
                continue
            # A finished value: the document itself, a list item, a key or a mapping value.
            if not stack:
                root = value
                continue
            frame = stack[-1]
            if height >= frame[3]:
                frame[3] = height + 1
            container = frame[0]
            if type(container) is list:
                container.append(value)
            elif frame[1] is nokey:
                if type(value) is not str:
                    self._bad_key(event, value)
                if value in container:
                    self.fail(event, f"duplicate key {value!r}: a key may appear once in a "
                                     "mapping (YAML would silently keep the last one)")
                frame[1] = value
            else:
                container[frame[1]] = value
                frame[1] = nokey

    def alias(self, event: Any, depth: int) -> tuple[Any, int, int]:
        name = event.anchor
        if name not in self.anchors:
            self.fail(event, f"alias *{name} refers to no anchor &{name} before it")
        found = self.anchors[name]
        if found is None:
            self.fail(event, f"alias *{name} is inside its own anchor &{name} (a recursive "
                             "structure)")
        assert found is not None
        value, size, height = found
        if self.nodes + size > self.max_nodes:
            self._too_many(event)
        if depth + height > self.max_depth:
            self.fail(event, f"alias *{name} nests the document more than {self.max_depth} "
                             "levels deep")
        return value, size, height

    def _too_many(self, event: Any) -> None:
        self.fail(event, f"more than {self.max_nodes} values with aliases expanded (the "
                         "most this kind of file may hold); a YAML alias bomb, or not the "
                         "right file")

    def _bad_tag(self, event: Any, tag: str) -> None:
        short = tag.replace(_TAG, "!!")
        self.fail(event, f"tag {short} is not allowed: ringtune files hold plain text, "
                         "numbers, true/false, null, lists and mappings only")

    def _bad_key(self, event: Any, value: Any) -> None:
        if isinstance(value, (list, dict)):
            self.fail(event, "a list or mapping as a mapping key; keys must be text")
        kind = {bool: "true/false", type(None): "null"}.get(type(value), type(value).__name__)
        self.fail(event, f"key {getattr(event, 'value', value)!r} is read as {kind}, not "
                         "text; quote it (keys must be text)")

    def plain(self, event: Any, value: str | None = None) -> Any:
        """A plain (unquoted, untagged) scalar: its type from YAML 1.1's implicit rules
        (those of ``yaml.safe_load``), less timestamps. ``value``: the text, when there is
        no event (the table reader)."""
        if value is None:
            value = event.value
        tag = _STR
        for rtag, rx in self.resolvers.get(value[:1], ()):
            if rx.match(value):
                tag = rtag
                break
        out = self.convert(event, tag, value)
        if len(value) <= 64:
            self.cache[value] = out
        return out

    def tagged(self, event: Any) -> Any:
        """A quoted scalar (text) or one with an explicit tag (only the plain ones)."""
        tag = event.tag
        if tag is None or tag == "!":
            return event.value
        if tag not in _SCALAR_TAGS:
            self._bad_tag(event, tag)
        return self.convert(event, tag, event.value)

    def convert(self, event: Any, tag: str, value: str) -> Any:
        if tag == _STR:
            return value
        if tag == _INT:
            if value.isdigit() and (value[0] != "0" or value == "0") and len(value) < 20:
                out = int(value)
            else:
                if len(value) > 40:
                    self.fail(event, f"integer {value[:20]}… is out of range (at most "
                                     f"{MAX_INT})")
                out = self._construct(event, "construct_yaml_int", value, "an integer")
            if not MIN_INT <= out <= MAX_INT:
                self.fail(event, f"integer {value} is out of range (at most {MAX_INT})")
            return out
        if tag == _FLOAT:
            # ``12.5`` as written by ringtune: float() reads it as PyYAML would.
            f = (float(value) if _DECIMAL.match(value) else
                 self._construct(event, "construct_yaml_float", value, "a number"))
            if not math.isfinite(f):
                self.fail(event, f"{value} is not a finite number")
            return f
        if tag == _BOOL:
            b = _BOOLS.get(value.lower())
            if b is None:
                self.fail(event, f"{value!r} is not true or false")
            return b
        if tag == _NULL:
            if value not in ("", "~", "null", "Null", "NULL"):
                self.fail(event, f"{value!r} is not null")
            return None
        if tag == _TAG + "merge":
            self.fail(event, "merge keys (<<) are not supported; write the keys out")
        self._bad_tag(event, tag)

    def _construct(self, event: Any, method: str, value: str, kind: str) -> Any:
        from yaml.nodes import ScalarNode

        try:
            return getattr(self.ctor, method)(ScalarNode(_TAG, value))
        except (ValueError, IndexError):
            self.fail(event, f"{value!r} is not {kind}")


class _NoKey:
    __slots__ = ()


_NOKEY: Any = _NoKey()


# -- JSON ----------------------------------------------------------------------------------


def parse_json(text: str, source: str = "<input>", max_nodes: int = MAX_NODES,
               max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON into plain data with the bounds of ``parse_text`` (JSON has no aliases:
    the size bound holds the values; duplicate keys and NaN/Infinity are refused)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise InputError(f"{source}: duplicate key {k!r}: a key may appear once in "
                                 "an object")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise InputError(f"{source}: {name} is not a finite number")

    def integer(digits: str) -> int:
        if len(digits) > 40 or not MIN_INT <= int(digits) <= MAX_INT:
            raise InputError(f"{source}: integer {digits[:20]} is out of range (at most "
                             f"{MAX_INT})")
        return int(digits)

    def number(digits: str) -> float:
        f = float(digits)
        if not math.isfinite(f):
            raise InputError(f"{source}: {digits} is not a finite number")
        return f

    enabled = gc.isenabled()
    gc.disable()
    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant,
                          parse_int=integer, parse_float=number)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply (more than {max_depth} levels)") \
            from None
    finally:
        if enabled:
            gc.enable()
    _check_tree(data, source, max_nodes, max_depth)
    return data


def _check_tree(data: Any, source: str, max_nodes: int, max_depth: int) -> None:
    """Count and depth of a tree without aliases (iterative: the depth is not yet known)."""
    todo: list[tuple[Any, int]] = [(data, 0)]
    nodes = 0
    push: Callable[[tuple[Any, int]], None] = todo.append
    while todo:
        item, depth = todo.pop()
        nodes += 1
        if nodes > max_nodes:
            raise InputError(f"{source}: more than {max_nodes} values; not a ringtune file")
        if isinstance(item, (dict, list)):
            if depth >= max_depth:
                raise InputError(f"{source}: nested more than {max_depth} levels deep; no "
                                 "ringtune file needs that")
            for child in (item.values() if isinstance(item, dict) else item):
                if isinstance(child, (dict, list)):
                    push((child, depth + 1))
                else:
                    nodes += 1
