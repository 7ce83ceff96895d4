"""Draw docs/img/dataflow.svg, the README's picture of gpu-audit's data flow.

    .venv/bin/python docs/img/dataflow.py           # write docs/img/dataflow.svg
    .venv/bin/python docs/img/dataflow.py --check   # exit 1 when the SVG is not current

The picture is data (the boxes and arrows below) turned into SVG by hand-written,
deterministic code: no layout engine to install, the same bytes on every machine.
tests/docs/test_dataflow_picture.py fails when the committed SVG is not what this script
draws. Edit the boxes and arrows here, run it, commit both files.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

SVG = Path(__file__).with_suffix(".svg")
WIDTH, HEIGHT = 1000, 540

# What a box is: one of ours, an engine the site already runs, or data on disk.
FILL = {"ours": "#dbeafe", "engine": "#f1f5f9", "disk": "#fef3c7"}
STROKE = {"ours": "#1d4ed8", "engine": "#64748b", "disk": "#b45309"}


@dataclass(frozen=True)
class Box:
    key: str
    x: int
    y: int
    w: int
    h: int
    title: str
    lines: tuple[str, ...]
    kind: str  # a key of FILL

    def side(self, which: str, offset: int = 0) -> tuple[int, int]:
        """A point on one side: its middle moved by `offset` along the side."""
        if which == "left":
            return self.x, self.y + self.h // 2 + offset
        if which == "right":
            return self.x + self.w, self.y + self.h // 2 + offset
        if which == "top":
            return self.x + self.w // 2 + offset, self.y
        return self.x + self.w // 2 + offset, self.y + self.h


BOXES = {b.key: b for b in (
    Box("gpus", 20, 30, 200, 64, "GPUs",
        ("NVML · DCGM", "or the simulator, by name"), "engine"),
    Box("node", 20, 128, 200, 64, "the node",
        ("/proc · cgroups", "kubelet pod-resources"), "engine"),
    Box("launcher", 20, 250, 200, 78, "launcher",
        ("node-local GPU queue,", "checkpoint-first", "preemption"), "ours"),
    Box("exporter", 290, 30, 200, 162, "exporter",
        ("1. sample every GPU", "2. attribute every process", "to user, project, job, pod",
         "or Slurm job", "3. render /metrics", "4. write audit records"), "ours"),
    Box("spool", 290, 250, 200, 78, "spool",
        ("segments, CRC frames,", "hash-chained records", "a cursor per sink"), "disk"),
    Box("shipper", 290, 380, 200, 64, "shipper",
        ("batches, retries, dead", "letters: no loss, no dup"), "ours"),
    Box("prometheus", 560, 30, 190, 64, "Prometheus",
        ("scrapes /metrics,", "alerts/ rules"), "engine"),
    Box("alertmanager", 800, 30, 180, 50, "Alertmanager",
        ("waste, leaks, hardware",), "engine"),
    Box("grafana", 800, 110, 180, 50, "Grafana",
        ("dashboards/, built in code",), "engine"),
    Box("sinks", 560, 362, 190, 100, "sinks",
        ("local archive (default)", "Elasticsearch · OpenSearch", "InfluxDB 1/2/3 · Fluentd"),
        "engine"),
    Box("chargeback", 800, 230, 180, 64, "chargeback",
        ("monthly bill, report,", "replayable manifest"), "ours"),
    Box("verify", 800, 380, 180, 64, "audit verify",
        ("proves the trail complete", "in each backend"), "ours"),
)}


@dataclass(frozen=True)
class Arrow:
    points: tuple[tuple[int, int], ...]
    label: str = ""
    label_at: tuple[int, int] = (0, 0)


def _arrows() -> tuple[Arrow, ...]:
    b = BOXES
    gpus, node, launcher, exporter = b["gpus"], b["node"], b["launcher"], b["exporter"]
    spool, shipper, prom, sinks = b["spool"], b["shipper"], b["prometheus"], b["sinks"]
    am, grafana, charge, verify = b["alertmanager"], b["grafana"], b["chargeback"], b["verify"]
    return (
        Arrow((gpus.side("right"), (exporter.x, gpus.side("right")[1]))),
        Arrow((node.side("right"), (exporter.x, node.side("right")[1]))),
        Arrow((launcher.side("top", 60), (launcher.x + 160, 214), (255, 214), (255, 180),
               (exporter.x, 180)), "job-mapping files", (112, 230)),
        Arrow((launcher.side("right"), spool.side("left")), "job events", (226, 282)),
        Arrow((exporter.side("bottom"), spool.side("top")), "audit records", (398, 226)),
        Arrow((spool.side("bottom"), shipper.side("top"))),
        Arrow((shipper.side("right"), (sinks.x, shipper.side("right")[1]))),
        Arrow((exporter.side("right", -49), (prom.x, prom.side("left")[1])), "/metrics",
              (500, 55)),
        Arrow((prom.side("right", -10), (am.x, am.side("left")[1] - 3))),
        Arrow((prom.side("right", 14), (775, prom.side("right", 14)[1]), (775, 135),
               (grafana.x, 135))),
        Arrow((prom.side("bottom", -40), (615, 250), (charge.x, 250)), "recording rules",
              (660, 244)),
        Arrow((sinks.side("top", 40), (695, 276), (charge.x, 276)), "archive, search",
              (700, 292)),
        Arrow((sinks.side("right"), verify.side("left"))),
    )


def _text(x: int, y: int, text: str, *, size: int = 12, weight: str = "normal",
          anchor: str = "start", fill: str = "#0f172a") -> str:
    return (f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" '
            f'text-anchor="{anchor}" fill="{fill}">{escape(text)}</text>')


def _box(box: Box) -> list[str]:
    out = [f'<rect x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" rx="8" '
           f'fill="{FILL[box.kind]}" stroke="{STROKE[box.kind]}" stroke-width="1.5"/>',
           _text(box.x + 12, box.y + 20, box.title, size=14, weight="bold")]
    out += [_text(box.x + 12, box.y + 38 + 15 * i, line) for i, line in enumerate(box.lines)]
    return out


def _arrow(arrow: Arrow) -> list[str]:
    path = " ".join(f"{x},{y}" for x, y in arrow.points)
    out = [f'<polyline points="{path}" fill="none" stroke="#334155" stroke-width="1.5" '
           'marker-end="url(#head)"/>']
    if arrow.label:
        x, y = arrow.label_at
        out.append(_text(x, y, arrow.label, size=11, fill="#334155"))
    return out


def _legend() -> list[str]:
    out = []
    for i, (kind, what) in enumerate((("ours", "gpu-audit"), ("engine", "what the site runs"),
                                      ("disk", "on the node's disk"))):
        x = 20 + 200 * i
        out.append(f'<rect x="{x}" y="{HEIGHT - 34}" width="18" height="14" rx="3" '
                   f'fill="{FILL[kind]}" stroke="{STROKE[kind]}"/>')
        out.append(_text(x + 26, HEIGHT - 22, what))
    return out


def render() -> str:
    """The whole SVG document."""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="system-ui, sans-serif">',
        "<title>gpu-audit: the data flow on one GPU node</title>",
        '<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#334155"/></marker></defs>',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
    ]
    for arrow in _arrows():
        parts += _arrow(arrow)
    for box in BOXES.values():
        parts += _box(box)
    parts += _legend()
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/img/dataflow.svg is not what this draws")
    args = parser.parse_args(argv)
    svg = render()
    if args.check:
        if not SVG.exists() or SVG.read_text() != svg:
            print(f"{SVG} is not current: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    SVG.write_text(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
