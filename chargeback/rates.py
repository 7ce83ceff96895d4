"""The rates file: what a GPU-hour and a kWh cost.

    currency: EUR
    gpu_hour:                     # price per GPU-hour by GPU model (the GPU's name)
      default: 1.20               # any model not listed; omit it to require every model
      "NVIDIA H100 80GB HBM3": 3.00
    energy_kwh: 0.25              # price per kWh (counter energy)

A GPU model with no price and no `default` is refused when the bill is built, naming
every such model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import load_file

_CURRENCY = re.compile(r"^[A-Z]{3}$")


class _RatesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    currency: str = Field(description="ISO 4217 code, e.g. EUR")
    gpu_hour: dict[str, float]
    energy_kwh: float = 0.0

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not _CURRENCY.match(v):
            raise ValueError(f"must be a three-letter ISO 4217 code such as EUR, not {v!r}")
        return v

    @field_validator("gpu_hour")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [f"{k}: {p!r}" for k, p in v.items() if not math.isfinite(p) or p < 0]
        if bad:
            raise ValueError("prices must be finite and >= 0: " + ", ".join(bad))
        if not v:
            raise ValueError("needs at least one price (a `default` or a GPU model)")
        return v

    @field_validator("energy_kwh")
    @classmethod
    def _energy(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"must be finite and >= 0, not {v!r}")
        return v


@dataclass(frozen=True, slots=True)
class Rates:
    currency: str
    gpu_hour: dict[str, float]  # GPU model -> price; "default" for any other
    energy_kwh: float

    def gpu_hour_price(self, model: str) -> float:
        if model in self.gpu_hour:
            return self.gpu_hour[model]
        return self.gpu_hour["default"]

    def check_models(self, models: list[str], source: str) -> None:
        """ConfigError naming every GPU model the file has no price for."""
        if "default" in self.gpu_hour:
            return
        missing = sorted(m for m in set(models) if m not in self.gpu_hour)
        if missing:
            raise ConfigError(source, [f"gpu_hour: no price for GPU model {m!r} and no "
                                       "`default`" for m in missing])


def load_rates(path: str | Path) -> Rates:
    """Read and validate a rates file; ConfigError listing every problem."""
    f = load_file(_RatesFile, Path(path))
    return Rates(f.currency, dict(f.gpu_hour), f.energy_kwh)
