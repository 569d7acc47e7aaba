"""GPU probes that work without a GPU: CUDA-aware MPI detection, the override variable,
the launcher's rank layout, device choice, PCI bus ids, shared-GPU detection, transport
selection on a machine without CuPy (what needs processes: ``tests/cli/test_cuda_detect.py``)."""

from __future__ import annotations

import os

import pytest

from collectives.cuda import binding as B
from collectives.cuda import detect as D
from collectives.mpi import launcher as L


@pytest.mark.parametrize("value,expected", [
    (None, None), ("", None), ("  ", None), ("1", True), ("true", True), ("YES", True),
    ("on", True), ("0", False), ("false", False), ("No", False), ("off", False)])
def test_cuda_aware_env_parsing(value: str | None, expected: bool | None) -> None:
    assert D.parse_cuda_aware_env(value) is expected


def test_cuda_aware_env_typo_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"RINGTUNE_CUDA_AWARE='maybe'.*1.*0"):
        D.parse_cuda_aware_env("maybe")
    with pytest.raises(ValueError, match="RINGTUNE_CUDA_AWARE"):
        D.cuda_aware_mpi({"RINGTUNE_CUDA_AWARE": "2"})


def test_override_wins_over_detection() -> None:
    assert D.cuda_aware_mpi({"RINGTUNE_CUDA_AWARE": "1"}) is True
    assert D.cuda_aware_mpi({"RINGTUNE_CUDA_AWARE": "0"}) is False
    assert "override" in D.cuda_aware_reason({"RINGTUNE_CUDA_AWARE": "1"})


def test_mpich_wheel_exports_the_query_and_is_not_cuda_aware() -> None:
    """The MPICH wheel from PyPI exports MPIX_Query_cuda_support and answers 0."""
    from mpi4py import MPI

    if "MPICH" not in MPI.Get_library_version():
        pytest.skip("not the MPICH library")
    answer, where = D.query_cuda_support()
    assert answer is False, where
    assert os.path.exists(where)
    assert D.cuda_aware_mpi({}) is False
    assert "MPIX_Query_cuda_support() = 0" in D.cuda_aware_reason({})


def test_query_reports_missing_symbol(tmp_path: object) -> None:
    # libc exports no MPIX_Query_cuda_support: "cannot tell", not a crash.
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no libc to load")
    answer, why = D.query_cuda_support([libc, "/nonexistent/libmpi.so"])
    assert answer is None and "MPIX_Query_cuda_support" in why


@pytest.mark.parametrize("env,rank,source", [
    ({"MPI_LOCALRANKID": "3"}, 3, "MPI_LOCALRANKID"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 1, "OMPI_COMM_WORLD_LOCAL_RANK"),
    ({"SLURM_LOCALID": "2", "LOCAL_RANK": "5"}, 2, "SLURM_LOCALID"),
    ({"LOCAL_RANK": "5"}, 5, "LOCAL_RANK"),
    ({"MPI_LOCALRANKID": "x", "LOCAL_RANK": "4"}, 4, "LOCAL_RANK"),
    ({}, 0, "default"),
])
def test_local_rank_from_launcher_variables(env: dict[str, str], rank: int,
                                            source: str) -> None:
    assert L.local_rank(env) == (rank, source)


def test_local_size_and_world_rank_from_variables() -> None:
    assert L.local_size({"MPI_LOCALNRANKS": "4"}) == 4
    assert L.local_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}) == 8
    assert L.local_size({}) is None
    assert D.world_rank({"PMI_RANK": "7"}) == 7
    assert D.world_rank({}) == 0


@pytest.mark.parametrize("local,visible,device", [
    (0, 1, 0), (1, 1, 0), (3, 8, 3), (9, 8, 1), (2, 4, 2), (5, 2, 1)])
def test_one_rank_per_gpu_by_local_rank(local: int, visible: int, device: int) -> None:
    assert B.choose_device(local, visible) == device


def test_no_visible_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(B.GpuError, match=r"rank \d+: no GPU is visible.*CUDA_VISIBLE_DEVICES=''"):
        B.choose_device(0, 0)


@pytest.mark.parametrize("raw,norm", [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    (b"00000000:3B:00.0\x00", "0000:3b:00.0"),
    ("0000:3b:00.0", "0000:3b:00.0"),
    ("0001:C1:1F.7", "0001:c1:1f.7"),
    ("3b:00.0", "0000:3b:00.0"),
])
def test_bus_id_normalisation(raw: str | bytes, norm: str) -> None:
    assert B.normalize_bus_id(raw) == norm


def test_bad_bus_id_is_named() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id: 'gpu0'"):
        B.normalize_bus_id("gpu0")


def test_cuda_device_matched_to_nvml_record_by_bus_id() -> None:
    # NVML lists every GPU by bus; CUDA (with CUDA_VISIBLE_DEVICES=2,0) calls the third one 0.
    nvml = ["00000000:18:00.0", "00000000:3B:00.0", "00000000:86:00.0", "00000000:AF:00.0"]
    assert B.nvml_index_for("0000:86:00.0", nvml) == 2
    assert B.nvml_index_for("0000:18:00.0", nvml) == 0
    assert B.nvml_index_for("0000:99:00.0", nvml) is None
    assert B.nvml_index_for("0000:3b:00.0", ["garbage", b"00000000:3B:00.0"]) == 1


def test_shared_gpus_found_per_host_and_named_in_the_error() -> None:
    records = [("h1", "0000:3b:00.0"), ("h1", "0000:3b:00.0"), ("h2", "0000:3b:00.0"),
               ("h1", "0000:86:00.0")]
    groups = B.shared_gpus(records)
    assert groups == [[0, 1]]
    msg = B.shared_gpu_message(groups, records)
    assert "ranks 0, 1 on host h1" in msg and "0000:3b:00.0" in msg
    assert "one GPU per rank" in msg and "'staged'" in msg
    assert B.shared_gpus([("h", "a"), ("h", "b")]) == []


def test_binding_describe_names_device_bus_and_source() -> None:
    b = B.DeviceBinding(device=1, local_rank=3, source="MPI_LOCALRANKID", local_size=4,
                        visible=2, pci_bus_id="0000:3b:00.0", nvml_index=5)
    text = b.describe()
    assert "GPU 1" in text and "0000:3b:00.0" in text and "NVML 5" in text
    assert "local rank 3" in text and "MPI_LOCALRANKID" in text


def test_nccl_version_text() -> None:
    assert D.nccl_version_text(21805) == "2.18.5"
    assert D.nccl_version_text(2708) == "2.7.8"


def test_without_cupy_no_gpu_transport_is_available() -> None:
    import collectives.cuda as C

    ok, why = D.cupy_status()
    if ok:
        pytest.skip("CuPy and a GPU are present: covered by tests/gpu")
    assert "CuPy" in why or "GPU" in why
    assert C.available_transports() == []
    assert C.default_gpu_transport() == "staged"
    assert D.nccl_status()[0] is False


def test_gpu_buffer_without_cupy_names_the_fix() -> None:
    """A CUDA-array-like buffer on a rank without CuPy: the error says what to install."""
    from collectives.registry import backend_for

    if D.cupy_status()[0]:
        pytest.skip("CuPy and a GPU are present")

    class FakeCudaArray:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        expect = r"backend 'cupy' is not available.*CuPy is not installed.*ringtune\[cuda\]"
    else:  # CuPy installed, no usable GPU
        expect = r"rank \d+: got GPU work but CUDA sees no GPU.*pass NumPy arrays"
    with pytest.raises(ValueError, match=expect):
        backend_for(FakeCudaArray())


def test_gpu_transports_refuse_host_buffers() -> None:
    from collectives.cuda import make_gpu_transport
    from collectives.registry import get_backend, make_transport

    np_backend = get_backend("numpy")
    for name in ("staged", "nccl"):
        with pytest.raises(ValueError, match="host \\(NumPy\\) buffers use 'mpi'"):
            make_transport(name, None, np_backend)
        with pytest.raises(ValueError, match="moves GPU buffers"):
            make_gpu_transport(name, None, np_backend)


# --- the nccl decision: one GPU per rank, decided from every rank's bound device ----------


def test_nccl_one_gpu_per_rank_decision() -> None:
    import collectives.cuda as C

    # Slurm, one GPU per task: every rank sees "device 0", but the bus ids differ.
    assert C.nccl_one_gpu_per_rank([("n1", "0000:3b:00.0"), ("n1", "0000:5e:00.0"),
                                    ("n2", "0000:3b:00.0"), ("n2", "0000:5e:00.0")])
    # Two ranks of one host on one GPU.
    assert not C.nccl_one_gpu_per_rank([("n1", "0000:3b:00.0"), ("n1", "0000:3b:00.0")])
    # A rank without a GPU.
    assert not C.nccl_one_gpu_per_rank([("n1", "0000:3b:00.0"), None])
    assert C.nccl_one_gpu_per_rank([("n1", "0000:3b:00.0")])


class _GatherComm:
    """Rank 0 of a fake world whose other ranks contribute ``others`` to the allgather."""

    def __init__(self, others: list[object]) -> None:
        self.others = others
        self.gathered: list[object] = []

    def allgather(self, mine: object) -> list[object]:
        self.gathered.append(mine)
        return [mine, *self.others]


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, record: tuple[str, str] | None,
              shared_here: bool) -> None:
    import collectives.cuda.availability as C

    monkeypatch.setattr(C, "cupy_status", lambda: (True, "1 GPU(s) visible"))
    monkeypatch.setattr(C, "nccl_status", lambda: (True, "NCCL 2.21.5"))
    monkeypatch.setattr(C, "cuda_aware_mpi", lambda: False)
    monkeypatch.setattr(C, "gpu_record", lambda: record)
    monkeypatch.setattr(C, "gpus_shared_here", lambda: shared_here)


def test_collective_form_keeps_nccl_with_one_visible_gpu_per_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import collectives.cuda.availability as C

    # Each rank has its own CUDA_VISIBLE_DEVICES: the local heuristic (2 local ranks, 1
    # visible GPU) says "shared", the ranks' bus ids say otherwise.
    _fake_gpu(monkeypatch, ("n1", "0000:3b:00.0"), shared_here=True)
    assert C.available_transports() == ["staged"]
    comm = _GatherComm([("n1", "0000:5e:00.0")])
    assert C.available_transports(comm) == ["nccl", "staged"]
    assert comm.gathered == [("n1", "0000:3b:00.0")]


def test_collective_form_drops_nccl_when_ranks_share_a_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import collectives.cuda.availability as C

    _fake_gpu(monkeypatch, ("n1", "0000:3b:00.0"), shared_here=False)
    assert C.available_transports() == ["nccl", "staged"]
    assert C.available_transports(_GatherComm([("n1", "0000:3b:00.0")])) == ["staged"]
    # The same bus id on another host is another GPU.
    assert C.available_transports(_GatherComm([("n2", "0000:3b:00.0")])) == ["nccl",
                                                                             "staged"]
    # A peer without a GPU.
    assert C.available_transports(_GatherComm([None])) == ["staged"]


def test_collective_form_gathers_even_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank without CuPy still takes part in the gather (no rank left waiting)."""
    import collectives.cuda.availability as C

    monkeypatch.setattr(C, "cupy_status", lambda: (False, "CuPy is not importable"))
    comm = _GatherComm([("n1", "0000:3b:00.0")])
    assert C.available_transports(comm) == []
    assert comm.gathered == [None]
