"""User state round-trips exactly in each format, and the format follows the content."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_audit_ckpt import Checkpointer


def _roundtrip(tmp: Path, state: Any) -> tuple[Any, list[str]]:
    m = Checkpointer(tmp).save(1, state)
    resumed = Checkpointer(tmp).restore()
    assert resumed is not None
    return resumed.state, sorted(m.files)


def test_numpy_arrays_round_trip_bit_exact_without_pickle(tmp_path: Path) -> None:
    big = np.arange(3_000_000, dtype=np.float64)  # > 16 MiB: several slices, hashing thread
    state: dict[str, Any] = {
        "model": {"w/with/slashes": np.ones((3, 4), dtype=np.float32)[:, ::2],  # not contiguous
                  "scalar": np.array(3.5), "empty": np.zeros((0, 7))},
        "flags": np.array([True, False]), "when": np.array(["2026-12-01"], dtype="M8[D]"),
        "big": big,
    }
    back, files = _roundtrip(tmp_path, state)
    assert "arrays.json" in files and "state.pkl" not in files
    for a, b in [(state["model"]["w/with/slashes"], back["model"]["w/with/slashes"]),
                 (state["model"]["scalar"], back["model"]["scalar"]),
                 (state["model"]["empty"], back["model"]["empty"]),
                 (state["flags"], back["flags"]), (state["when"], back["when"]),
                 (big, back["big"])]:
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_mixed_state_falls_back_to_pickle(tmp_path: Path) -> None:
    state: dict[str, Any] = {"w": np.ones(2), "epoch": 3, "name": "run-1"}
    back, files = _roundtrip(tmp_path, state)
    assert "state.pkl" in files
    assert back["epoch"] == 3 and back["name"] == "run-1" and np.array_equal(back["w"], state["w"])


def test_torch_state_uses_torch_save_and_weights_only_load(tmp_path: Path) -> None:
    torch = pytest.importorskip(
        "torch", reason="torch is not in the [test] extra; scripts/setup --test installs it"
    )
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    back, files = _roundtrip(tmp_path, {"model": model.state_dict(), "optim": opt.state_dict()})
    assert "state.pt" in files
    for k, v in model.state_dict().items():
        assert torch.equal(v, back["model"][k])
    assert back["optim"]["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_torch_weights_only_refuses_arbitrary_objects(tmp_path: Path) -> None:
    torch = pytest.importorskip(
        "torch", reason="torch is not in the [test] extra; scripts/setup --test installs it"
    )
    Checkpointer(tmp_path).save(1, {"t": torch.ones(1), "obj": _Opaque()})
    with pytest.raises(pickle.UnpicklingError):
        Checkpointer(tmp_path).restore()
    resumed = Checkpointer(tmp_path, torch_weights_only=False).restore()
    assert resumed is not None and isinstance(resumed.state["obj"], _Opaque)


class _Opaque:
    pass
