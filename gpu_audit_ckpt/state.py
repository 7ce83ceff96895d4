"""Turning training state into checkpoint files and back: user state dicts and RNG state.

User state (model, optimizer, AMP scaler state dicts, anything the script passes):
- any torch.Tensor inside -> `state.pt` through torch.save, loaded with
  torch.load(weights_only=True) unless the Checkpointer is told otherwise;
- nested dicts of NumPy arrays only -> one `array-<i>.npy` per array plus `arrays.json`
  (the index: which array sits where in the nested dicts), loaded with allow_pickle=False.
  Raw .npy rather than .npz: no zip CRC and no copies, the bytes go from the array's
  memory to the file and the hash directly;
- anything else -> `state.pkl` (pickle).
Trust boundary: pickle, and torch.load with weights_only=False, run code from the file.
Only load checkpoints this job wrote; the manifest's SHA-256 detects damage, not tampering.

RNG state goes to `rng.json` (no pickle): Python `random`, NumPy's global generator,
torch's CPU generator and every CUDA device's when those libraries are loaded, and any
numpy.random.Generator or torch.Generator the script names.

numpy and torch are looked up in sys.modules, never imported here: a script that never
imported them has no state of theirs to save.
"""

from __future__ import annotations

import base64
import importlib
import json
import pickle
import random
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from gpu_audit_ckpt.store import Writer

STATE_PT = "state.pt"
STATE_PKL = "state.pkl"
ARRAYS_INDEX = "arrays.json"
RNG_FILE = "rng.json"
_SLICE = 16 << 20


def _mod(name: str) -> Any:
    return sys.modules.get(name)


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, Mapping):
        return [leaf for v in obj.values() for leaf in _leaves(v)]
    if isinstance(obj, list | tuple):
        return [leaf for v in obj for leaf in _leaves(v)]
    return [obj]


def _flatten_arrays(obj: Mapping[Any, Any], np: Any, path: tuple[str, ...] = ()) -> list[
    tuple[tuple[str, ...], Any]
] | None:
    """[(key path, array)] for nested str-keyed dicts of arrays; None if the state is not that."""
    out: list[tuple[tuple[str, ...], Any]] = []
    if not obj:
        return None
    for k, v in obj.items():
        if not isinstance(k, str):
            return None
        if isinstance(v, Mapping):
            sub = _flatten_arrays(v, np, (*path, k))
            if sub is None:
                return None
            out += sub
        elif isinstance(v, np.ndarray) and not v.dtype.hasobject:
            out.append(((*path, k), v))
        else:
            return None
    return out


def encode_state(state: Any) -> dict[str, Writer]:
    """The files (name -> writer) for a user state; the module docstring says which."""
    torch, np = _mod("torch"), _mod("numpy")
    leaves = _leaves(state)
    if torch is not None and any(isinstance(x, torch.Tensor) for x in leaves):
        return {STATE_PT: lambda fh: torch.save(state, fh)}
    if np is not None and isinstance(state, Mapping):
        flat = _flatten_arrays(state, np)
        if flat is not None:
            files: dict[str, Writer] = {}
            index = []
            for i, (path, arr) in enumerate(flat):
                name = f"array-{i}.npy"
                index.append({"path": list(path), "file": name})
                files[name] = _npy_writer(arr, np)
            data = json.dumps({"arrays": index}, separators=(",", ":")).encode()
            files[ARRAYS_INDEX] = lambda fh: fh.write(data)
            return files
    return {STATE_PKL: lambda fh: pickle.dump(state, fh, protocol=pickle.HIGHEST_PROTOCOL)}


def _npy_writer(arr: Any, np: Any) -> Writer:
    def write(fh: BinaryIO) -> None:
        a = arr if arr.flags.c_contiguous else arr.copy(order="C")  # keeps 0-d arrays 0-d
        header = np.lib.format.header_data_from_array_1_0(a)
        try:
            np.lib.format.write_array_header_1_0(fh, header)
        except ValueError:  # a header over 64 KiB (very many dimensions or fields)
            np.lib.format.write_array_header_2_0(fh, header)
        raw = memoryview(a.reshape(-1).view(np.uint8))
        # The array is not modified while save() runs, so its memory may be hashed in place.
        write_stable = getattr(fh, "write_stable", fh.write)
        for off in range(0, len(raw), _SLICE):
            write_stable(raw[off : off + _SLICE])

    return write


def state_files(names: Iterable[str]) -> list[str]:
    return [n for n in names if n in (STATE_PT, STATE_PKL, ARRAYS_INDEX)]


def decode_state(directory: Path, name: str, *, weights_only: bool = True) -> Any:
    """Load the state that encode_state wrote as `name` (STATE_PT, ARRAYS_INDEX, STATE_PKL)."""
    path = directory / name
    if name == STATE_PT:
        import torch  # noqa: PLC0415 - a state.pt exists only where torch was used

        return torch.load(path, map_location="cpu", weights_only=weights_only)
    if name == ARRAYS_INDEX:
        import numpy as np  # noqa: PLC0415 - as above, for numpy

        out: dict[str, Any] = {}
        for entry in json.loads(path.read_bytes())["arrays"]:
            node = out
            *parents, leaf = entry["path"]
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = np.load(directory / entry["file"], allow_pickle=False)
        return out
    with open(path, "rb") as fh:
        return pickle.load(fh)  # noqa: S301 - trust boundary documented above


# ---- RNG state as JSON -------------------------------------------------------------------


def _to_json(obj: Any) -> Any:
    np = _mod("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.dtype.str, "data": obj.tolist()}
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode()}
    if isinstance(obj, Mapping):
        return {str(k): _to_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_to_json(v) for v in obj]
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    return obj


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            import numpy as np  # noqa: PLC0415 - written only where numpy was loaded

            return np.array(obj["data"], dtype=np.dtype(obj["__ndarray__"]))
        if "__bytes__" in obj:
            return base64.b64decode(obj["__bytes__"])
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


def _tensor_bytes(t: Any) -> bytes:
    return bytes(t.tolist())


def _bytes_tensor(b: bytes) -> Any:
    import torch  # noqa: PLC0415 - torch state was saved, so torch is installed

    return torch.tensor(list(b), dtype=torch.uint8)


def capture_rng(generators: Mapping[str, Any]) -> dict[str, Any]:
    """Every RNG state worth restoring, as JSON-able data."""
    version, internal, gauss = random.getstate()
    doc: dict[str, Any] = {"python": [version, list(internal), gauss]}
    np, torch = _mod("numpy"), _mod("torch")
    if np is not None:
        doc["numpy"] = _to_json(list(np.random.get_state()))
    if torch is not None:
        doc["torch_cpu"] = _to_json(_tensor_bytes(torch.get_rng_state()))
        # Only once CUDA is in use: asking earlier would create a context on every device.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            doc["torch_cuda"] = [
                _to_json(_tensor_bytes(s)) for s in torch.cuda.get_rng_state_all()
            ]
    gens: dict[str, Any] = {}
    for name, gen in generators.items():
        if hasattr(gen, "bit_generator"):
            gens[name] = {"kind": "numpy", "state": _to_json(gen.bit_generator.state)}
        elif hasattr(gen, "get_state") and hasattr(gen, "set_state"):
            gens[name] = {"kind": "torch", "state": _to_json(_tensor_bytes(gen.get_state()))}
        else:
            raise TypeError(
                f"generator {name!r} is a {type(gen).__name__}: expected a numpy.random."
                "Generator or a torch.Generator"
            )
    doc["generators"] = gens
    return doc


def rng_writer(doc: Mapping[str, Any]) -> Writer:
    data = json.dumps(doc, separators=(",", ":")).encode()

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    return write


def restore_rng(doc: Mapping[str, Any], generators: Mapping[str, Any]) -> list[str]:
    """Put every saved RNG state back; returns warnings for what could not be restored."""
    notes: list[str] = []
    version, internal, gauss = doc["python"]
    random.setstate((version, tuple(internal), gauss))
    np, torch = _mod("numpy"), _mod("torch")
    if "numpy" in doc:
        if np is None:  # saved with numpy loaded: restore it too
            np = importlib.import_module("numpy")
        np.random.set_state(tuple(_from_json(doc["numpy"])))
    if "torch_cpu" in doc:
        if torch is None:  # saved with torch loaded: restore it too
            torch = importlib.import_module("torch")
        torch.set_rng_state(_bytes_tensor(_from_json(doc["torch_cpu"])))
        cuda = doc.get("torch_cuda")
        if cuda:
            if not torch.cuda.is_available():
                notes.append(f"{len(cuda)} CUDA RNG states saved but CUDA is unavailable now")
            else:
                states = [_bytes_tensor(_from_json(s)) for s in cuda]
                n = torch.cuda.device_count()
                if n != len(states):
                    notes.append(f"{len(states)} CUDA RNG states saved, {n} devices now")
                for i, s in enumerate(states[:n]):
                    torch.cuda.set_rng_state(s, i)
    saved = doc.get("generators", {})
    for name, gen in generators.items():
        entry = saved.get(name)
        if entry is None:
            notes.append(f"generator {name!r} not in the checkpoint: left as it is")
        elif entry["kind"] == "numpy":
            gen.bit_generator.state = _from_json(entry["state"])
        else:
            gen.set_state(_bytes_tensor(_from_json(entry["state"])))
    for name in saved.keys() - generators.keys():
        notes.append(f"generator {name!r} saved but not passed to restore: not restored")
    for note in notes:
        warnings.warn(f"gpu_audit_ckpt: {note}", RuntimeWarning, stacklevel=3)
    return notes
