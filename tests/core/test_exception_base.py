"""One exception hierarchy: every error class gpu-audit defines derives from
gpu_audit.errors.GpuAuditError, whose `exit_code` the command line ends with (a
configuration error 2, any other 1). The job-side helper (gpu_audit_ckpt) imports nothing
of ours and keeps its own."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from gpu_audit.errors import EXIT_FAILURE, EXIT_USAGE, ConfigError, GpuAuditError

PACKAGES = ("gpu_audit", "gpu_audit_app", "exporter", "shipper", "alerts", "dashboards",
            "chargeback", "launcher")
GENERATED = ("exporter.attribution._podresources",)  # protobuf/gRPC stubs


def _modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        mod = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"{package}."):
            # __main__ modules run a command when imported
            if not info.name.startswith(GENERATED) and not info.name.endswith("__main__"):
                names.append(info.name)
    return names


def _exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                found.append(obj)
    return found


def test_every_error_class_derives_from_the_project_base() -> None:
    """No error class of ours derives straight from Exception or a builtin alone."""
    classes = _exception_classes()
    assert len(classes) >= 40, "the walk found too few classes to mean anything"
    stray = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes
                   if not issubclass(c, GpuAuditError))
    assert stray == []


@pytest.mark.parametrize(("cls", "code"), [(ConfigError, EXIT_USAGE),
                                           (GpuAuditError, EXIT_FAILURE)])
def test_the_exit_code_mapping(cls: type[GpuAuditError], code: int) -> None:
    """A configuration error ends a command with 2 (nothing was started); any other
    error of ours with 1."""
    assert cls.exit_code == code


def test_an_error_of_ours_ends_the_command_with_its_exit_code_and_a_message(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An error of ours that reaches the command line is one line on stderr and its exit
    code, never a traceback."""
    from gpu_audit_app import cli

    class Boom(GpuAuditError):
        pass

    def dispatch(*_: object) -> int:
        raise Boom("the archive is locked by pid 7")

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    assert cli.main(["spool", "stats", "/nonexistent"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.strip() == "gpu-audit spool: the archive is locked by pid 7"
