"""The environment fingerprint of a job attempt: only what is known, CUDA from the build."""

from __future__ import annotations

from launcher.audit import fingerprint_from


def test_cuda_from_torch_build_and_environment_override() -> None:
    fp = fingerprint_from({"python": "3.11.2", "torch": "2.4.1+cu121"}, {})
    assert (fp["python"], fp["torch"], fp["cuda"]) == ("3.11.2", "2.4.1+cu121", "12.1")
    fp = fingerprint_from({"python": "3.11.2", "torch": "2.4.1+cu121"},
                          {"CUDA_VERSION": "12.4.1", "CONTAINER_IMAGE": "nvcr.io/pt:24.05"})
    assert (fp["cuda"], fp["container_image"]) == ("12.4.1", "nvcr.io/pt:24.05")


def test_unknown_is_absent() -> None:
    """A job that is not a Python we could ask has no python/torch keys at all (never "")."""
    fp = fingerprint_from(None, {})
    assert "python" not in fp and "torch" not in fp and "cuda" not in fp
    assert all(v for v in fp.values())
    fp = fingerprint_from({"python": "3.12.1", "torch": None}, {})
    assert "torch" not in fp
