"""A simulated node for launcher tests: virtual clock, SimGpuSource, SimExecutor, Engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.config import EngineConfig, LauncherCoreConfig, PolicyConfig
from launcher.engine import Engine
from launcher.gpustate import GIB
from launcher.scheduler import Scheduler
from launcher.sim import SimBehaviour, SimExecutor
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec, load_submission
from launcher.store import Event, JobRecord, Store

T0 = 1_700_000_000.0


@dataclass
class Node:
    gpus: int = 4
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    behaviours: dict[str, SimBehaviour] = field(default_factory=dict)
    default: SimBehaviour = field(default_factory=SimBehaviour)
    store_path: str = ":memory:"
    now: float = T0

    def __post_init__(self) -> None:
        self.sim = SimGpuSource(self.gpus, memory_total_bytes=80 * GIB)
        self.executor = SimExecutor(self.sim, self.clock, self.behaviour)
        self.store = Store(self.store_path)
        self.engine = Engine(self.store, Scheduler(self.policy), self.sim, self.executor,
                             self.clock, LauncherCoreConfig(policy=self.policy,
                                                            engine=self.engine_config))
        self.events: list[Event] = []

    def clock(self) -> float:
        return self.now

    def behaviour(self, _job_id: int, spec: JobSpec) -> SimBehaviour:
        return self.behaviours.get(spec.name, self.default)

    def submit(self, yaml_text: str, uid: int = 1000, user: str = "alice") -> list[int]:
        return self.engine.submit(load_submission(yaml_text), uid, user)

    def job(self, name: str, **fields: object) -> JobSpec:
        return JobSpec.model_validate({"name": name, "command": ["train"], **fields})

    def run(self, seconds: float, step: float = 10.0,
            until: Callable[[], bool] | None = None) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            self.events.extend(self.engine.tick())
            if until is not None and until():
                return

    def rec(self, job_id: int) -> JobRecord:
        r = self.store.get(job_id)
        assert r is not None
        return r

    def kinds(self, job_id: int) -> list[str]:
        return [e.kind for e in self.store.events(job_id)]
