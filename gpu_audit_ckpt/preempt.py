"""The preemption flag: a signal handler that records the request and its deadline, nothing else.

The checkpoint itself happens in the training loop at a step boundary (Checkpointer.
should_checkpoint), never inside the handler: a handler runs between any two bytecodes and
could interrupt an optimizer update half-way.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from gpu_audit_ckpt.constants import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_PREEMPT_SIGNALS,
    ENV_PREEMPT_GRACE_SECONDS,
    ENV_PREEMPT_SIGNAL,
)


def parse_signal(name: str | int) -> signal.Signals:
    if isinstance(name, int):
        return signal.Signals(name)
    text = name.strip().upper()
    if text.isdigit():
        return signal.Signals(int(text))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def signals_from_env(environ: Any = os.environ) -> list[signal.Signals]:
    raw = environ.get(ENV_PREEMPT_SIGNAL, "").strip()
    names = [n for n in raw.split(",") if n.strip()] if raw else list(DEFAULT_PREEMPT_SIGNALS)
    problems, out = [], []
    for n in names:
        try:
            out.append(parse_signal(n))
        except ValueError as exc:
            problems.append(f"{ENV_PREEMPT_SIGNAL}={raw!r}: {exc}")
    if problems:
        raise ValueError("; ".join(problems))
    return out


def grace_from_env(environ: Any = os.environ) -> float:
    raw = environ.get(ENV_PREEMPT_GRACE_SECONDS, "").strip()
    if not raw:
        return DEFAULT_GRACE_SECONDS
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not grace >= 0 or grace == float("inf"):
        raise ValueError(f"{ENV_PREEMPT_GRACE_SECONDS}={raw!r}: expected seconds >= 0")
    return grace


class PreemptFlag:
    """Set by a signal; read by the training loop."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.requested = False
        self.signal_time: float | None = None
        self.signal_name: str | None = None
        self.deadline: float | None = None
        self.grace = DEFAULT_GRACE_SECONDS
        self._previous: dict[signal.Signals, Any] = {}

    def install(
        self, signals: Iterable[str | int] | None = None, grace: float | None = None
    ) -> None:
        sigs = [parse_signal(s) for s in signals] if signals is not None else signals_from_env()
        self.grace = grace if grace is not None else grace_from_env()
        for sig in sigs:
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only attribute stores: no I/O, no locks, no allocation worth mentioning.
        if not self.requested:
            now = self._clock()
            self.signal_time = now
            self.deadline = now + self.grace
            self.signal_name = signal.Signals(signum).name
            self.requested = True

    def request(self, reason: str = "manual") -> None:
        """Ask for a checkpoint-and-exit from code (e.g. a collective said another rank got one)."""
        if not self.requested:
            now = self._clock()
            self.signal_time, self.deadline = now, now + self.grace
            self.signal_name = reason
            self.requested = True

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self._clock()


# The process's flag once `install()` ran: a script can install it first thing, before
# importing torch (seconds during which a signal would otherwise kill it), and every
# Checkpointer created later reads the same flag.
_installed: PreemptFlag | None = None


def install(signals: Iterable[str | int] | None = None, grace: float | None = None) -> PreemptFlag:
    """Install the process-wide preemption flag (signals and grace default to the environment)."""
    global _installed  # noqa: PLW0603 - one signal disposition per process, by nature
    if _installed is None:
        _installed = PreemptFlag()
    _installed.install(signals, grace)
    return _installed


def installed() -> PreemptFlag | None:
    return _installed

