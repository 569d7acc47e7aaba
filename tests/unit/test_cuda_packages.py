"""ringtune's GPU code checked against the real CuPy, NCCL and NVML packages — no GPU needed.

CuPy, ``cupy.cuda.nccl`` (with ``libnccl.so.2`` from ``nvidia-nccl-cu12``), NVRTC and
``nvidia-ml-py`` all import and answer questions on a machine without a GPU or driver; only
running work needs the device. So wherever ``ringtune[cuda]`` is installed (``make
cuda-static`` builds such an environment, and ``make test`` runs it) these tests check what
the fakes of the other unit tests cannot:

* every CuPy, NCCL and NVML call in ``collectives/cuda``, ``probes`` and
  ``benchmarks/bench_gpu.py`` names something the installed package has, and binds to its
  signature (found from the source by AST, so a new call is checked without editing this
  file);
* NCCL's datatype and op values equal the fallback table of ``collectives.cuda.nccl``,
  and NCCL's version is read and printed the way ``load_nccl`` does;
* every reduction kernel compiles with NVRTC as CuPy compiles it: the raw kernels as they
  are, the float16/bfloat16 ``ElementwiseKernel`` bodies inside the code CuPy generates
  around them (its headers, its ``float16``/``bfloat16`` classes);
* ``probes.gpu.NvmlResponder`` runs over the real ``pynvml`` functions' signatures and turns
  their answers into GPU records.

Each test skips, with the reason, where its package is missing (the CPU-only ``.venv``).
"""

from __future__ import annotations

import ast
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from collectives.cuda import kernels as K

ROOT = Path(__file__).resolve().parents[2]
CUDA_SOURCES = [*sorted((ROOT / "collectives" / "cuda").glob("*.py")),
                ROOT / "benchmarks" / "bench_gpu.py"]
NVML_SOURCES = [ROOT / "probes" / "gpu.py", ROOT / "collectives" / "cuda" / "binding.py"]


def _cupy() -> Any:
    return pytest.importorskip("cupy", reason="CuPy is not installed (pip install "
                               "'ringtune[cuda]'; `make cuda-static` does it)")


def _nccl() -> Any:
    _cupy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy warns when libnccl.so.2 is missing
        from cupy.cuda import nccl
    if not getattr(nccl, "available", False):
        pytest.skip("libnccl.so.2 is not installed (pip install nvidia-nccl-cu12)")
    return nccl


# -- signatures ---------------------------------------------------------------------------

_DOC_SIG = re.compile(r"^\s*[\w.]+\((?P<params>.*)\)")


def signature_of(fn: Any) -> inspect.Signature:
    """``fn``'s signature: from ``inspect`` where Python knows it, else from the first line of
    a Cython docstring (``memcpyAsync(intptr_t dst, intptr_t src, size_t size, …)``), with
    C types dropped."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    m = _DOC_SIG.match((fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
    if m is None:
        raise AssertionError(f"{fn!r}: no signature and no signature line in its docstring")
    params: list[inspect.Parameter] = []
    kind: Any = inspect.Parameter.POSITIONAL_OR_KEYWORD
    for raw in filter(None, (p.strip() for p in m.group("params").split(","))):
        if raw == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        if raw.startswith("**"):
            params.append(inspect.Parameter(raw[2:], inspect.Parameter.VAR_KEYWORD))
            continue
        if raw.startswith("*"):
            params.append(inspect.Parameter(raw[1:], inspect.Parameter.VAR_POSITIONAL))
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        decl, eq, default = raw.partition("=")
        name = decl.split()[-1].lstrip("*&")
        params.append(inspect.Parameter(
            name, kind, default=default.strip() if eq else inspect.Parameter.empty))
    return inspect.Signature(params)


def _binds(fn: Any, n_args: int, keywords: list[str], method: bool) -> str | None:
    """None when ``fn`` accepts ``n_args`` positional arguments and these keywords (after
    ``self`` when ``method``), else why not."""
    sig = signature_of(fn)
    args = (["self"] if method else []) + ["x"] * n_args
    try:
        sig.bind(*args, **{k: "x" for k in keywords})
    except TypeError as exc:
        return f"{exc} (signature {sig})"
    return None


# -- the calls ringtune makes, found in its source -------------------------------------------


class Call:
    """One call (or attribute read) of a package in our source."""

    def __init__(self, path: Path, node: ast.AST, text: str, n_args: int | None,
                 keywords: list[str]) -> None:
        self.file = path.name
        self.where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        self.text = text
        self.n_args = n_args  # None: an attribute read, not a call
        self.keywords = keywords


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names, else None (``f(x).y`` is not a chain)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _calls(paths: list[Path]) -> Iterator[Call]:
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred)
                                                      for a in node.args):
                func = node.func
                args = list(node.args)
                # partial(self.nv.nvmlX, h, link) calls nvmlX with the bound arguments.
                if _dotted(func) == "partial" and args:
                    func, args = args[0], args[1:]
                text = _dotted(func)
                if text is not None:
                    yield Call(path, node, text, len(args),
                               [k.arg for k in node.keywords if k.arg])
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                text = _dotted(node)
                if text is not None:
                    yield Call(path, node, text, None, [])


def _resolve(root: Any, dotted: str) -> Any:
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _check(calls: Iterator[Call], aliases_in: Callable[[str], dict[str, Any]],
           methods: dict[str, Any]) -> tuple[list[str], set[str]]:
    """Problems, and which alias/method keys were seen at all. ``aliases_in(file name)``
    says which names stand for which package in that file."""
    problems: list[str] = []
    seen: set[str] = set()
    for call in calls:
        aliases = aliases_in(call.file)
        if call.text in methods:
            seen.add(call.text)
            if call.n_args is not None:
                why = _binds(methods[call.text], call.n_args, call.keywords, method=True)
                if why:
                    problems.append(f"{call.where}: {call.text}(…): {why}")
            continue
        prefix = next((a for a in sorted(aliases, key=len, reverse=True)
                       if call.text.startswith(a + ".")), None)
        if prefix is None:
            continue
        seen.add(prefix)
        rest = call.text[len(prefix) + 1:]
        try:
            target = _resolve(aliases[prefix], rest)
        except AttributeError as exc:
            problems.append(f"{call.where}: {call.text}: {exc}")
            continue
        if call.n_args is not None and callable(target):
            why = _binds(target, call.n_args, call.keywords, method=False)
            if why:
                problems.append(f"{call.where}: {call.text}(…): {why}")
    return problems, seen


def test_every_cupy_and_nccl_call_exists_and_binds() -> None:
    cupy = _cupy()
    nccl = _nccl()
    # How the GPU modules name the packages: CuPy everywhere (CudaOps keeps it and its
    # runtime as attributes); NCCL as ``mod`` in the transports (where ``nccl`` is a
    # parameter that may be the tests' fake) and as ``nccl`` in detect.py (where ``mod`` is
    # mpi4py's MPI).
    common = {"cupy": cupy, "self._cupy": cupy, "self._rt": cupy.cuda.runtime,
              "rt": cupy.cuda.runtime}
    per_file = {"nccl.py": {"mod": nccl, "self.mod": nccl},
                "detect.py": {"nccl": nccl}}

    def aliases_in(file: str) -> dict[str, Any]:
        return {**common, **per_file.get(file, {})}

    # Method calls on CuPy/NCCL objects, by the receiver's name in our source.
    methods = {
        "event.record": cupy.cuda.Event.record,
        "self._begin.record": cupy.cuda.Event.record,
        "event.synchronize": cupy.cuda.Event.synchronize,
        "stream.wait_event": cupy.cuda.Stream.wait_event,
        "self.stream.wait_event": cupy.cuda.Stream.wait_event,
        "stream.synchronize": cupy.cuda.Stream.synchronize,
        "self.stream.synchronize": cupy.cuda.Stream.synchronize,
        "comm.send": nccl.NcclCommunicator.send,
        "comm.recv": nccl.NcclCommunicator.recv,
        "self.comm.allReduce": nccl.NcclCommunicator.allReduce,
    }
    problems, seen = _check(_calls(CUDA_SOURCES), aliases_in, methods)
    assert not problems, "\n".join(problems)
    # The scan found the calls it exists for (a rename in our code must update this test).
    expected = {"cupy", "self._cupy", "self._rt", "rt", "mod", "nccl",
                "event.record",
                "self._begin.record", "stream.wait_event", "self.stream.wait_event",
                "comm.send", "comm.recv", "self.comm.allReduce"}
    assert expected <= seen, f"not found in collectives/cuda: {sorted(expected - seen)}"


def test_signature_parser_reads_cython_docstrings() -> None:
    cupy = _cupy()
    sig = signature_of(cupy.cuda.runtime.memcpyAsync)
    assert list(sig.parameters) == ["dst", "src", "size", "kind", "stream"]
    assert _binds(cupy.cuda.runtime.memcpyAsync, 4, [], method=False) is not None
    assert _binds(cupy.cuda.runtime.memcpyAsync, 5, [], method=False) is None
    assert _binds(cupy.RawKernel, 2, ["backend"], method=False) is None
    assert _binds(cupy.RawKernel, 2, ["no_such_option"], method=False) is not None


def test_event_done_is_a_property_as_cudaops_expects() -> None:
    cupy = _cupy()
    from collectives.cuda.ops import CudaOps

    assert isinstance(inspect.getattr_static(cupy.cuda.Event, "done"), property)
    ops = CudaOps.__new__(CudaOps)
    assert ops.done(SimpleNamespace(done=False)) is False
    assert ops.done(SimpleNamespace(done=True)) is True


def test_nccl_values_match_the_fallback_table() -> None:
    nccl = _nccl()
    from collectives.cuda.nccl import NCCL_DTYPES, NCCL_OPS

    wrong = [f"{name}: ours {val}, NCCL {getattr(nccl, name, None)}"
             for name, val in [*NCCL_DTYPES.values(), *NCCL_OPS.values()]
             if getattr(nccl, name, None) != val]
    assert not wrong, wrong
    assert int(nccl.NCCL_UINT8) == 1  # the byte type sends and receives use


def test_nccl_version_is_read_and_named() -> None:
    nccl = _nccl()
    from collectives.cuda.detect import _load_nccl, nccl_version_text

    _load_nccl.cache_clear()
    mod, why = _load_nccl()
    code = int(nccl.get_version())
    assert mod is nccl
    assert why == f"NCCL {nccl_version_text(code)}"
    major, minor, _ = (int(x) for x in nccl_version_text(code).split("."))
    assert (major, minor) >= (2, 7), "the nccl transport needs NCCL send/recv (2.7+)"


# -- the kernels, compiled as CuPy compiles them ----------------------------------------------


def _nvrtc() -> tuple[Any, list[str], Any, Any]:
    _cupy()
    try:
        import cupy._core.core as core
        from cupy._core import _scalar
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - no NVRTC library, or CuPy internals moved
        pytest.skip(f"NVRTC is not usable through CuPy here ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0]}); pip install nvidia-cuda-nvrtc-cu12")
    # CuPy's own include paths and C++ standard; a Hopper virtual architecture (no device
    # to ask for its own).
    options = [*core.assemble_cupy_compiler_options(()), "-arch=compute_90"]
    return nvrtc, options, core, _scalar


def _compile(nvrtc: Any, options: list[str], source: str, name: str) -> str:
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        nvrtc.compileProgram(prog, options)
    except Exception:  # noqa: BLE001 - the log says what failed
        return nvrtc.getProgramLog(prog)
    ptx = nvrtc.getPTX(prog)
    text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    return "" if ".entry" in text else "no kernel entry in the PTX"


@pytest.mark.parametrize("dtype", sorted(K.RAW_TYPES))
def test_raw_kernels_compile_with_nvrtc(dtype: str) -> None:
    nvrtc, options, _, _ = _nvrtc()
    logs = {op: _compile(nvrtc, options, K.reduce_source(dtype, op), f"{dtype}_{op}.cu")
            for op in K.KERNEL_OPS}
    assert not any(logs.values()), logs


def _elementwise_source(core: Any, scalar: Any, dtype: np.dtype, params: str,
                        refs: str, body: str) -> str:
    """What ``cupy.ElementwiseKernel`` generates for one contiguous 1-D launch: CuPy's
    headers, the type declarations of ``dtype`` (its float16/bfloat16 class), ``T``, and the
    body inside CuPy's grid-stride loop."""
    decls: set[str] = set()
    tname = scalar.get_typename(dtype, decls)
    headers = "".join(f"#include <{h}>\n" for h in core._cupy_header_list)
    return (f"{headers}{scalar.format_type_decls(decls)}typedef {tname} T;\n"
            f'extern "C" __global__ void k({params.format(T=tname)}, CIndexer<1, 1> _ind) {{\n'
            "  CUPY_FOR(i, _ind.size()) {\n    _ind.set(i);\n"
            f"    {refs}\n    {body};\n  }}\n}}\n")


def _half_dtypes() -> list[np.dtype]:
    out = [np.dtype(np.float16)]
    try:
        import ml_dtypes

        out.append(np.dtype(ml_dtypes.bfloat16))
    except ImportError:
        pass
    return out


def test_half_kernels_compile_inside_cupys_generated_code() -> None:
    nvrtc, options, core, scalar = _nvrtc()
    pair = ("const CArray<{T}, 1, 1, 1> _raw_x, CArray<{T}, 1, 1, 1> _raw_y",
            "const T &x = _raw_x[_ind.get()]; T &y = _raw_y[_ind.get()];")
    scaled = ("const float n, CArray<{T}, 1, 1, 1> _raw_y", "T &y = _raw_y[_ind.get()];")
    failures = {}
    dtypes = _half_dtypes()
    for dt in dtypes:
        jobs = {op: (*pair, body) for op, body in K.EW_OPS.items()}
        # CupyBackend.divide's half kernel: ElementwiseKernel("float32 n", "T y", …).
        jobs["div"] = (*scaled, "y = (float)y / n")
        for what, (params, refs, body) in jobs.items():
            log = _compile(nvrtc, options,
                           _elementwise_source(core, scalar, dt, params, refs, body),
                           f"{dt}_{what}.cu")
            if log:
                failures[f"{dt} {what}"] = log[-1500:]
    assert not failures, failures
    if len(dtypes) < 2:
        pytest.skip("float16 checked; ml_dtypes is not installed, so bfloat16 was not")


# -- NVML --------------------------------------------------------------------------------------


def _pynvml() -> Any:
    return pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install "
                               "'ringtune[cuda]')")


def test_every_nvml_call_exists_and_binds() -> None:
    pynvml = _pynvml()
    problems, seen = _check(_calls(NVML_SOURCES),
                            lambda _file: {"self.nv": pynvml, "pynvml": pynvml}, {})
    assert not problems, "\n".join(problems)
    assert {"self.nv", "pynvml"} <= seen


class _CheckedNvml:
    """The real ``pynvml`` module's signatures with canned answers: every call is bound to
    the real function's signature (a mismatch is recorded, then raised — which ``NvmlResponder``
    would swallow as "unknown" on a real GPU, hence the record)."""

    ANSWERS: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "580.65.06",
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: f"handle{i}",
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=150_754_820_096),
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(
            busId=b"00000000:1B:00.0" if h == "handle0" else b"00000000:43:00.0"),
        "nvmlDeviceGetNumaNodeId": lambda h: 0,
        "nvmlDeviceGetCpuAffinity": lambda h, n: [0xFF] + [0] * (n - 1),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetTopologyCommonAncestor": lambda a, b: 40,
        "nvmlDeviceGetP2PStatus": lambda a, b, idx: 0,
        "nvmlDeviceGetNvLinkState": lambda h, link: 1 if link < 2 else 0,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: SimpleNamespace(
            busId=b"00000000:43:00.0" if h == "handle0" else b"00000000:1B:00.0"),
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: 0,
    }

    def __init__(self, real: Any) -> None:
        self._real = real
        self.problems: list[str] = []
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        real_fn = getattr(self._real, name)  # AttributeError for a name pynvml lacks
        answer = self.ANSWERS.get(name)
        if answer is None:
            raise AssertionError(f"no canned answer for {name}: add one to this test")

        def call(*args: Any) -> Any:
            self.called.add(name)
            try:
                signature_of(real_fn).bind(*args)
            except TypeError as exc:
                self.problems.append(f"{name}{args}: {exc}")
                raise
            return answer(*args)

        return call


def test_nvml_responder_reads_gpus_through_real_signatures() -> None:
    pynvml = _pynvml()
    from probes.gpu import NvmlResponder, gpus_from

    nv = _CheckedNvml(pynvml)
    gpus, pairs = gpus_from(NvmlResponder(nv), "/nonexistent-root", None)
    assert not nv.problems, nv.problems
    assert not set(_CheckedNvml.ANSWERS) - {"nvmlInit", "nvmlShutdown"} - nv.called - {
        "nvmlSystemGetDriverVersion"}, "NvmlResponder no longer asks for some answers"
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert [g.bus_id for g in gpus] == ["0000:1b:00.0", "0000:43:00.0"]
    assert gpus[0].memory_bytes == 150_754_820_096
    assert (gpus[0].pcie_gen, gpus[0].pcie_width) == (5, 16)
    assert gpus[0].cpus == tuple(range(8))
    assert [(x.remote, x.kind, x.links) for x in gpus[0].nvlinks] == [
        ("0000:43:00.0", "gpu", 2)]
    assert len(pairs) == 1 and pairs[0].nvlinks == 2 and pairs[0].label == "NV2"
