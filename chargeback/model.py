"""The data every chargeback layer shares: what a source measured, and the bill.

Units: seconds and joules in `SourceData` (what sources add up), hours and kWh in the
`Bill` (what a reader pays for). An owner is (user, project); None means not known.
The unattributed owner is `UNATTRIBUTED` (both None): GPU time held only by processes
nobody owns. Idle fleet time (a GPU up and held by no process) is not an owner: it is
`SourceData.fleet` minus everything held, and becomes the bill's idle row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

Owner = tuple[str | None, str | None]  # (user, project)
UNATTRIBUTED: Owner = (None, None)


@dataclass(slots=True)
class Usage:
    """What one owner used on GPUs of one model over the period (or one day of it).

    allocated_gpu_seconds: GPU time allocated to the owner (allocation records, the
        job-mapping / `gpu_allocation_info`), whether or not a process ran.
    used_gpu_seconds: GPU time a process of the owner held the GPU (memory > 0); a GPU
        held by two owners counts fully for each.
    charged_gpu_seconds: used time with a shared GPU's interval split equally among
        the distinct owners on it, so that over all owners + unattributed + idle it adds
        up to the fleet's up time (the reconciliation's quantity).
    busy_gpu_seconds: utilisation-weighted GPU time (elapsed x SM utilisation).
    idle_held_gpu_seconds: time held while the GPU's utilisation was < 5 %.
    energy_joules: from the energy counter (counter resets handled, MIG instances of
        one physical GPU counted once), split among holders as docs/AUDIT.md says.
    power_energy_joules: the same energy from integrated power draw (cross-check).
    """

    allocated_gpu_seconds: float = 0.0
    used_gpu_seconds: float = 0.0
    charged_gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    idle_held_gpu_seconds: float = 0.0
    energy_joules: float = 0.0
    power_energy_joules: float = 0.0

    def add(self, other: Usage) -> None:
        self.allocated_gpu_seconds += other.allocated_gpu_seconds
        self.used_gpu_seconds += other.used_gpu_seconds
        self.charged_gpu_seconds += other.charged_gpu_seconds
        self.busy_gpu_seconds += other.busy_gpu_seconds
        self.idle_held_gpu_seconds += other.idle_held_gpu_seconds
        self.energy_joules += other.energy_joules
        self.power_energy_joules += other.power_energy_joules


@dataclass(slots=True)
class Fleet:
    """The fleet over the period (or one UTC day), per GPU model or in total.

    gpu_seconds: GPUs x time while up (what the fleet could deliver).
    down_gpu_seconds: GPU time lost to GPUs that were down (not in gpu_seconds).
    held_gpu_seconds: time any process (owned or not) held a GPU.
    busy_gpu_seconds / idle_held_gpu_seconds: as in Usage, fleet-wide.
    energy_joules / power_energy_joules: all GPUs' energy, counter and integrated power.
    """

    gpu_seconds: float = 0.0
    down_gpu_seconds: float = 0.0
    held_gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    idle_held_gpu_seconds: float = 0.0
    energy_joules: float = 0.0
    power_energy_joules: float = 0.0

    def add(self, other: Fleet) -> None:
        self.gpu_seconds += other.gpu_seconds
        self.down_gpu_seconds += other.down_gpu_seconds
        self.held_gpu_seconds += other.held_gpu_seconds
        self.busy_gpu_seconds += other.busy_gpu_seconds
        self.idle_held_gpu_seconds += other.idle_held_gpu_seconds
        self.energy_joules += other.energy_joules
        self.power_energy_joules += other.power_energy_joules


@dataclass(slots=True)
class Completeness:
    """Whether the records a bill was made from are all there (the archive source).

    chains: per host and stream, one sentence: the chain proven continuous from the
        last record before the period to the first after it (or "open": no record
        after it yet), or why it is not;
    gaps: every gap, missing or damaged part, each naming host, stream, seqs and files;
        a bill with any is refused unless --allow-gaps (`allowed` then), and says so
        everywhere it is written;
    silent: hosts and streams with records in the period before this one and none in it;
    expected_gpu_hours: GPU-hours the inventory (the GPUs each host's records name in
        the period) stands for over the time each host's chain covers;
        observed_gpu_hours: up + down GPU-hours its records account for. The difference
        is time no record accounts for (exporter stopped, samples paused).
    """

    chains: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)
    inventory_gpus: int = 0
    inventory_hosts: int = 0
    expected_gpu_hours: float = 0.0
    observed_gpu_hours: float = 0.0
    allowed: bool = False  # billed with gaps (--allow-gaps)

    @property
    def status(self) -> str:
        """"complete", or "GAPS (--allow-gaps)" (what the CSV column and banner say)."""
        return "GAPS (--allow-gaps)" if self.gaps else "complete"


@dataclass(slots=True)
class SourceData:
    """Everything one source measured for [start, end): the input of `build_bill`.

    usage: per (owner, GPU model) -> Usage; UNATTRIBUTED is one owner among them.
        GPU model is the GPU's name ("NVIDIA A100-SXM4-80GB"), "unknown" when absent.
    fleet: per GPU model -> Fleet.
    days: per UTC day ("2026-11-03") -> (usage per owner over all models, fleet total),
        for the report's by-day charts.
    queries: every query issued, in order (Prometheus PromQL with its time/step, an
        ES request body as canonical JSON, or the archive parts read): the manifest.
    inputs: what was read and its fingerprint (URL, archive directory, part name ->
        sha256), for the manifest.
    simulated_excluded: how many simulated records (archive/ES) or series (Prometheus)
        were left out; simulated_included: True when --include-simulated.
    verified: True when the hash chain verified, False when it did not and
        --allow-unverified let it through (verification_problems says what), None when
        the source has no chain (Prometheus).
    """

    source: str  # "prometheus" | "archive" | "elasticsearch" | "opensearch"
    start: datetime
    end: datetime
    usage: dict[tuple[Owner, str], Usage] = field(default_factory=dict)
    fleet: dict[str, Fleet] = field(default_factory=dict)
    days: dict[str, tuple[dict[Owner, Usage], Fleet]] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)
    simulated_excluded: int = 0
    simulated_included: bool = False
    verified: bool | None = None
    verification_problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # --compare-with: what each other source read for the same period (source -> data);
    # the manifest records their queries and inputs beside this source's
    compared: dict[str, SourceData] = field(default_factory=dict)
    # the archive and search sources: proof that no record is missing (None: no proof)
    completeness: Completeness | None = None
    # False where the source cannot see reservations (the audit records carry none):
    # allocated GPU-hours are then "not known", written empty, never another column's copy
    allocation_known: bool = True
    # per UTC day -> GPU model -> Fleet, where the source has it (the archive): the
    # capacity report's day bins from one read
    model_days: dict[str, dict[str, Fleet]] = field(default_factory=dict)


@dataclass(slots=True)
class Row:
    """One line of the bill. kind: "owner", "unattributed" or "idle".

    Owner rows are keyed (department, project, user); unknown project/user is "" in
    the row (the CSV has no None) and the department of a user or project not in the
    directory is "unmapped". Costs are in the rates file's currency.
    """

    kind: str
    department: str
    project: str
    user: str
    allocated_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    charged_gpu_hours: float = 0.0
    busy_gpu_hours: float = 0.0
    idle_held_gpu_hours: float = 0.0
    energy_kwh: float = 0.0
    power_energy_kwh: float = 0.0
    gpu_cost: float = 0.0
    energy_cost: float = 0.0
    idle_share_cost: float = 0.0
    total_cost: float = 0.0


@dataclass(slots=True)
class Reconciliation:
    """Rows + unattributed + idle against the fleet's GPU-hours (up time only)."""

    fleet_gpu_hours: float
    down_gpu_hours: float
    owners_gpu_hours: float  # sum of owner rows' charged GPU-hours
    unattributed_gpu_hours: float
    idle_gpu_hours: float
    difference_gpu_hours: float  # fleet - (owners + unattributed + idle)
    fleet_energy_kwh: float
    rows_energy_kwh: float
    power_energy_kwh: float  # integrated-power cross-check
    energy_difference_kwh: float  # counter - power (fleet)
    # other sources' figures for the same period when compared: source -> fleet GPU-hours
    other_sources: dict[str, float] = field(default_factory=dict)
    # --compare-with: source -> how that source's bill of the same period differs
    comparisons: dict[str, SourceComparison] = field(default_factory=dict)


@dataclass(slots=True)
class RowDifference:
    """One row of the bill against the same row of another source's bill (a row only
    one of them has counts as 0 in the other). `key`: "kind/department/project/user"."""

    key: str
    charged_gpu_hours: float  # this bill's
    other_charged_gpu_hours: float
    energy_kwh: float
    other_energy_kwh: float
    total_cost: float
    other_total_cost: float


@dataclass(slots=True)
class SourceComparison:
    """Another source's bill of the same period (same rates, directory, policy): its
    reconciliation figures, and the rows that differ most from this bill's (by the
    absolute difference in total cost, then charged GPU-hours; at most `MAX_ROWS`)."""

    fleet_gpu_hours: float
    owners_gpu_hours: float
    unattributed_gpu_hours: float
    idle_gpu_hours: float
    fleet_energy_kwh: float
    rows_energy_kwh: float
    largest_differences: list[RowDifference] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Line:
    """One line item of a row's GPU cost: its charged GPU-hours on one GPU model at that
    model's price, so `gpu_cost` can be recomputed from the bill alone (the line-items
    CSV). A row's lines sum to its `gpu_cost`."""

    kind: str
    department: str
    project: str
    user: str
    gpu_model: str
    charged_gpu_hours: float
    gpu_hour_price: float
    gpu_cost: float


@dataclass(slots=True)
class Bill:
    start: datetime
    end: datetime
    source: str
    currency: str
    idle_policy: str  # "none" | "proportional" | "even"
    idle_policy_note: str  # e.g. the fallback taken when every weight was zero
    rows: list[Row]  # owner rows sorted by (department, project, user), then unattributed, idle
    reconciliation: Reconciliation
    days: dict[str, tuple[dict[Owner, Usage], Fleet]]
    unmapped: list[str]  # users/projects that fell into "unmapped"
    simulated_excluded: int
    simulated_included: bool
    verified: bool | None
    verification_problems: list[str]
    notes: list[str]
    completeness: Completeness | None = None
    # False: a showback (no rates file): hours and energy only, every cost column empty
    priced: bool = True
    allocation_known: bool = True  # False: allocated GPU-hours are not known (empty)
    energy_kwh_price: float = 0.0  # the rates file's price per kWh
    lines: list[Line] = field(default_factory=list)  # GPU cost per row and GPU model


@dataclass(frozen=True, slots=True)
class Request:
    """One chargeback run, as the CLI took it: what the manifest records and replays.

    Paths are as given. The manifest records each file's sha256 and embeds the rates
    and directory files' content; replay bills from those stored copies and reports a
    rates or directory file that changed or is gone since (it does not refuse).
    """

    start: datetime  # inclusive, UTC
    end: datetime  # exclusive, UTC
    source: str  # "prometheus" | "archive" | "elasticsearch" | "opensearch"
    config: str | None  # --config FILE: where the archive and sinks are
    prometheus_url: str | None
    # rates file (YAML): price per GPU-hour by model, energy price, currency; None: a
    # showback (hours and energy, no cost)
    rates: str | None
    directory: str | None  # directory file (YAML): user -> department, project -> department
    idle_policy: str  # "none" | "proportional" | "even"
    out: str  # output directory
    include_simulated: bool = False
    allow_unverified: bool = False
    allow_gaps: bool = False  # bill from a trail with gaps, stamped everywhere
    # archive: read every record of sealed parts too (and check the seals' sums)
    verify_records: bool = False
    # archive: the length of the bins of `days` / `model_days` when shorter than a day
    # (keys YYYY-MM-DDTHH:MM; seals sum whole days, so the period's parts are read)
    bin_seconds: float | None = None
    # archive: check each sealed part's SHA-256 against its seal; False: its size only
    # (the capacity report: it uses key-proven seals' sums, never a sealed part's bytes)
    hash_sealed_parts: bool = True
    # archive: Prometheus that kept the exporters' chain heads (gpu_audit_audit_head); the
    # archive must hold each of them, as `audit verify --witness` checks
    witness: str | None = None
    # --sink NAME: which configured archive or search sink to read (needed when the
    # configuration has two of the source's kind)
    sink: str | None = None
    # archive, unkeyed trail: bill sealed parts from their rollups without reading them,
    # though no key proves them (the bill is then marked unverified, saying why)
    trust_unkeyed_seals: bool = False
    # --compare-with: other sources read for the same period, whose bills are compared
    # with this one (reconciliation.comparisons); none of them may be `source`
    compare_with: tuple[str, ...] = ()
    csv_totals: bool = False  # a `total` line at the end of the CSV
    excel: bool = False  # the CSVs with a UTF-8 byte-order mark (spreadsheet tools)
