"""The figures people read: the algorithm column of ``ringtune bench``'s table
(``collectives.bench._algo_label``) and the bandwidth of ``ringtune tune``'s progress lines."""

from __future__ import annotations

from collectives.bench import Measurement, _algo_label


def _m(algorithm: str, params: dict[str, object]) -> Measurement:
    return Measurement(nbytes=1024, count=256, dtype="float32", op="sum", algorithm=algorithm,
                       params=params, time_us=1.0, algbw_gbps=1.0, busbw_gbps=1.0)


def test_ring_parameters_are_abbreviated_and_others_keep_their_name() -> None:
    assert _algo_label(_m("native", {})) == "native"
    assert _algo_label(_m("multiring", {"rings": 2, "chunk_bytes": 65536,
                                        "order": "topology"})) == "multiring(r2,c65536)"
    # A parameter of a plugin algorithm: its name and value, not run together.
    assert _algo_label(_m("sleep", {"seconds": 0.0})) == "sleep(seconds=0.0)"
    assert _algo_label(_m("rhd", {"order": "identity"})) == "rhd"


def test_tune_progress_keeps_small_bandwidths_readable() -> None:
    from autotune.progress import best_text, gbps_text

    assert gbps_text(12.345) == "12.35 GB/s"
    assert gbps_text(0.000512) == "0.000512 GB/s"
    # 1 KiB in 2000 us at 2 ranks: 0.000512 GB/s, which ".2f" printed as 0.00.
    assert best_text(2000.0, 1024, 2).startswith("0.000512 GB/s")
