"""Delivery throughput per sink, 1 KB audit records, side by side in one run.

Measures records/s through each sink's send() (encoding, HTTP and outcome
classification included) to: real InfluxDB 1.x (v1 API), real VictoriaMetrics (v2 API),
the in-process Elasticsearch `_bulk` server (official client) and the local archive
(fsync on). Beside them, influxdb-client's own batching WriteApi sends the same records
straight to the same VictoriaMetrics (v2 is all it speaks) with no durability at all,
and the ratio ours / theirs is printed.

    .venv/bin/python bench/bench_sinks.py [--records 50000] [--batch 5000] [--json out.json]

The in-process bulk server shares the interpreter (and the GIL) with the sink, so its
figure is a lower bound of the sink's own cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import Outcome, SinkRecord
from shipper.sinks.elasticsearch.bulk import SearchSink
from shipper.sinks.elasticsearch.client import ElasticClient
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from tests.realservers import influxd_server, victoria_metrics_server
from tests.shipper.sinks.records import one_kb_batch
from tests.shipper.sinks.servers.search import SearchServer


def run_sink(send: Callable[[Sequence[SinkRecord]], Sequence[Any]],
             records: list[SinkRecord], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(records), batch):
        results = send(records[i : i + batch])
        bad = [r for r in results if r.outcome is not Outcome.DELIVERED]
        if bad:
            raise SystemExit(f"not delivered: {bad[0]}")
    return len(records) / (time.perf_counter() - start)


def influxdb_client_rate(url: str, records: list[SinkRecord], batch: int) -> float:
    """influxdb-client's batching WriteApi, same records as dict points, no durability."""
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import WriteOptions

    points = []
    for rec in records:
        doc = rec.doc
        points.append({
            "measurement": f"gpu_audit_{doc['kind']}",
            "tags": {"host": doc["host"], "gpu_uuid": doc["gpu"]["uuid"],
                     "pid": str(doc.get("process", {}).get("pid", "")),
                     "stream": doc["stream"]},
            "fields": {**{k: float(v) for k, v in doc["values"].items()}, "seq": doc["seq"],
                       "record_id": rec.record_id, "record": rec.raw.decode()},
            "time": doc["time_ns"],
        })
    start = time.perf_counter()
    with InfluxDBClient(url=url, token="x", org="o") as client:
        write_api = client.write_api(write_options=WriteOptions(batch_size=batch,
                                                                flush_interval=1_000))
        write_api.write(bucket="audit", record=points, write_precision="ns")
        write_api.close()  # waits for its buffer to drain
    return len(records) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    records = one_kb_batch(args.records)
    size = sum(len(r.raw) for r in records) / len(records)
    out: dict[str, Any] = {"records": args.records, "batch": args.batch,
                           "mean_record_bytes": round(size), "records_per_s": {}}
    rates = out["records_per_s"]
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        with influxd_server(tmp) as influx:
            cfg1 = InfluxV1SinkConfig.model_validate(
                {"type": "influxdb_v1", "url": influx.url, "database": influx.database})
            rates["influxdb_v1 (real influxd 1.x)"] = run_sink(
                InfluxV1Sink(cfg1, "i1").send, records, args.batch)
        with victoria_metrics_server(tmp) as vm_server:
            vm = vm_server.url
            cfg2 = InfluxV2SinkConfig.model_validate(
                {"type": "influxdb_v2", "url": vm, "bucket": "audit", "org": "o",
                 "flavour": "victoriametrics"})
            ours = run_sink(InfluxV2Sink(cfg2, "i2").send, records, args.batch)
            rates["influxdb_v2 (real VictoriaMetrics)"] = ours
            theirs = influxdb_client_rate(vm, records, args.batch)
            rates["influxdb-client WriteApi, no durability (real VictoriaMetrics)"] = theirs
            out["ratio_ours_vs_influxdb_client"] = ours / theirs
        with SearchServer("elasticsearch") as srv:
            cfg3 = ElasticsearchSinkConfig.model_validate(
                {"type": "elasticsearch", "hosts": [srv.url]})
            rates["elasticsearch (in-process _bulk server)"] = run_sink(
                SearchSink(cfg3, "es", ElasticClient(cfg3)).send, records, args.batch)
        arch_cfg = ArchiveSinkConfig.model_validate({"type": "archive"})
        archive = ArchiveSink(arch_cfg, "archive", tmp / "archive")
        archive.start()
        rates["archive (fsync per batch)"] = run_sink(archive.send, records, args.batch)
    for name, rate in rates.items():
        print(f"{name:<66} {rate:>10,.0f} records/s")
    print(f"ratio ours (VictoriaMetrics v2) / influxdb-client WriteApi: "
          f"{out['ratio_ours_vs_influxdb_client']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
