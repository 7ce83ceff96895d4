"""Every bound the launcher puts on what a user sends it, in one place.

Two kinds:
- `SpecBounds`: the range of every number (and the size of every list and string) in a
  job spec. `launcher/spec.py` builds its field constraints from these, so a spec can
  never ask for a share of a GPU below the smallest the design allows, an infinite run
  time or memory no GPU could have.
- `DaemonLimits`: what one connection and the whole daemon may hold (connections per
  uid and in total, bytes buffered per request and across the daemon, how long a client
  has to send its request and to read the answer), and the range of every number a
  request may carry (ids, attempts, offsets). The daemon's configuration file sets them
  (`limits:`); the defaults suit a shared node.

A number outside its range is refused with the rule it broke, never clamped: a user
must learn that 1e-300 of a GPU is not a thing, not get 0.1 silently. This module is
declarations only; it must never do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# The largest integer JSON carries exactly (2**53): ids and offsets above it cannot have
# come from us, and SQLite and os.pread would fail on some of them.
MAX_JSON_INT = 1 << 53


@dataclass(frozen=True, slots=True)
class SpecBounds:
    """The range of each field of a job spec (launcher/spec.py)."""

    min_gpu_fraction: float = 0.1  # the design's smallest GPU share
    max_gpus: int = 64  # whole GPUs one job may ask for (no node has more)
    max_gpu_memory_bytes: int = 1 << 44  # 16 TiB per GPU: beyond any GPU made
    max_runtime_seconds: float = 366 * 86400.0  # a year
    max_retries: int = 100
    max_urgency: int = 10
    max_jobs: int = 1000  # jobs in one submission
    max_after: int = 1000  # dependencies of one job
    max_argv: int = 4096  # words of a command
    max_env: int = 256  # variables in a job's `env`
    max_text: int = 4096  # characters of a path or an env value
    max_label: int = 128  # characters of a project or department name
    max_command_chars: int = 256 * KIB


SPEC = SpecBounds()


class DaemonLimits(BaseModel):
    """What one client and all clients together may cost the daemon
    (launcher/connections.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_connections: int = Field(
        default=1024, ge=1, le=1_000_000,
        description="Connections open at once, all users together; a connection past it "
        "is answered \"too many connections: N\" and closed. The daemon raises its file "
        "limit (RLIMIT_NOFILE) to the hard limit at start and warns when this does not "
        "fit under it.")
    per_uid_connections: int = Field(
        default=32, ge=1, le=1_000_000,
        description="Connections one uid may hold open at once; the next is answered "
        "\"too many connections for uid U: N\" and closed.")
    per_uid_connect_rate: float = Field(
        default=50.0, gt=0, le=1_000_000, allow_inf_nan=False,
        description="New connections per second one uid may open, on average (bursts up "
        "to per_uid_connect_burst); one past it is answered \"busy\" and closed before "
        "anything else is done for it, so a connect/close loop costs the daemon almost "
        "nothing and cannot crowd out other users (the client retries busy answers for "
        "a few seconds).")
    per_uid_connect_burst: int = Field(
        default=100, ge=1, le=1_000_000,
        description="New connections one uid may open at once before "
        "per_uid_connect_rate applies.")
    listen_backlog: int = Field(
        default=4096, ge=16, le=65535,
        description="Connections the kernel queues for the daemon before it accepts them "
        "(capped by net.core.somaxconn); a connection finding the queue full waits in the "
        "client, which retries for a few seconds before saying the daemon is busy.")
    max_user_sockets: int = Field(
        default=512, ge=0, le=65536,
        description="Listening sockets of single users the daemon keeps beside the common "
        "one (<socket>.d/<uid>, made after a user's first connection, used by the client "
        "from then on), so one user's connection flood queues in front of nobody else; "
        "one descriptor each; past it users share the common socket; 0: off.")
    max_request_bytes: int = Field(
        default=1 * MIB, ge=4 * KIB, le=64 * MIB,
        description="Bytes of one request (one JSON line, a submission's YAML included); "
        "a longer one is answered \"request too large\" and the connection closed.")
    max_buffered_bytes: int = Field(
        default=32 * MIB, ge=64 * KIB, le=1 << 34,
        description="Bytes of requests and answers held for all connections together; "
        "above it the daemon stops reading requests until answers drain or slow clients "
        "are dropped (memory stays bounded whatever clients send).")
    request_timeout_seconds: float = Field(
        default=10.0, gt=0, le=3600,
        description="Seconds a client has from connecting to sending its whole request; "
        "then it is dropped (an idle connection holds no slot forever).")
    submit_timeout_seconds: float = Field(
        default=10.0, gt=0, le=600,
        description="Seconds a submission's YAML may take to read (in a worker process, "
        "off the daemon's loop); a longer one is refused as too large or too nested. The "
        "uids' submissions are read in turn, at most 8 waiting per uid.")
    write_timeout_seconds: float = Field(
        default=5.0, gt=0, le=3600,
        description="Seconds a client has to read its answer once it is ready; a client "
        "that does not read is dropped (counted and logged once), so it never stalls the "
        "daemon or anyone else.")
    daemon_nice: int = Field(
        default=-10, ge=-20, le=19,
        description="The daemon's CPU priority (nice value), raised at start when it "
        "may (root or CAP_SYS_NICE): one user's busy processes (four connect/close loops "
        "on two cores) otherwise leave the loop that answers everyone a fifth of a CPU. "
        "Jobs, fingerprint probes and the submission reader run at the priority the "
        "daemon was started with (through nice(1)).")
    events_window_seconds: float = Field(
        default=10.0, gt=0, le=3600,
        description="The window the events budget of a job counts in (below).")
    events_max_bytes: int = Field(
        default=256 * KIB, ge=4 * KIB, le=64 * MIB,
        description="Bytes of a job's events file (GPU_AUDIT_EVENTS_FILE) the daemon reads "
        "per job per events_window_seconds; what a job writes beyond it is skipped (the "
        "newest checkpoint in it still counts), named in the daemon's log and stored as an "
        "`events_over_budget` event of the job. Never more than this is read per tick.")
    events_max_lines: int = Field(
        default=2000, ge=10, le=1_000_000,
        description="Lines of a job's events file the daemon takes per job per "
        "events_window_seconds; the rest is skipped as for events_max_bytes.")


# Ranges of the numbers a request may carry (launcher/protocol.py).
MAX_JOB_ID = MAX_JSON_INT
MAX_ATTEMPT = 1_000_000
MAX_LOG_OFFSET = MAX_JSON_INT
LOG_CHUNK_BYTES = 256 * KIB  # bytes of log one `logs` answer carries at most
MAX_RESPONSE_BYTES = 256 * MIB  # the client refuses an answer larger than this
