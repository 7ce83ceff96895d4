"""Every alert's runbook_url points to a section that exists in docs/runbooks.md."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from alerts.params import load_params
from alerts.render import ALERTS_FILE, render

ROOT = Path(__file__).resolve().parents[2]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings: lower case, spaces to '-', punctuation dropped."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^#+\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_every_runbook_url_has_its_section() -> None:
    """Each alert (in both params files' renderings) links to docs/runbooks.md#<alert>,
    and that heading exists."""
    anchors = _anchors((ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8"))
    missing = []
    for params in ("production.yaml", "fast.yaml"):
        text = render(load_params(ROOT / "alerts" / "params" / params), params)[ALERTS_FILE]
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                url = rule["annotations"]["runbook_url"]
                page, _, anchor = url.partition("#")
                assert page == "docs/runbooks.md", url
                if anchor not in anchors or anchor != rule["alert"].lower():
                    missing.append(f"{params}: {rule['alert']} -> {url}")
    assert not missing, "runbook sections missing:\n" + "\n".join(missing)


def test_every_hardware_runbook_says_what_to_tell_the_owner() -> None:
    """Hardware alerts name the GPU's owner; each one's runbook section says what to tell
    them (their job is the one the failing GPU hit)."""
    text = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    sections = dict(zip(*[iter(re.split(r"^## +(.+)$", text, flags=re.M)[1:])] * 2,
                        strict=True))
    rendered = render(load_params(ROOT / "alerts" / "params" / "production.yaml"), "p")
    hardware = [r["alert"] for g in yaml.safe_load(rendered[ALERTS_FILE])["groups"]
                for r in g["rules"] if r["labels"]["category"] == "hardware"]
    assert len(hardware) == 10
    missing = [name for name in hardware if "- Tell the owner:" not in sections[name]]
    assert missing == []
