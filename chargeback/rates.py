"""The rates file: what a GPU-hour and a kWh cost.

    currency: EUR
    gpu_hour:                     # price per GPU-hour by GPU model (the GPU's name)
      default: 1.20               # any model not listed; omit it to require every model
      "NVIDIA H100 80GB HBM3": 3.00
    energy_kwh: 0.25              # price per kWh (counter energy)

A GPU model with no price and no `default` is refused when the bill is built, naming
every such model. Every price is a finite number from 0 to `MAX_PRICE` (a bound far
above any real price, well below where a month of a large fleet would overflow a
float): a typo of a few zeros or a 300-digit number is refused with its line, never
carried into a bill (an infinite cost would fail at the writing, after the source was
read). Without a rates file the bill is a showback (`SHOWBACK`): hours and energy,
no cost.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import load_file

_CURRENCY = re.compile(r"^[A-Z]{3}$")
# The largest price per GPU-hour or per kWh a rates file may give (docs/CHARGEBACK.md).
# 10^6 x a 10,000-GPU fleet x a year's hours is ~10^14: no float trouble anywhere.
MAX_PRICE = 1_000_000.0


def _price(v: float) -> float:
    if not math.isfinite(v) or v < 0 or v > MAX_PRICE:
        raise ValueError(f"a price must be a finite number from 0 to {MAX_PRICE:,.0f}, "
                         f"not {v!r}")
    return v


Price = Annotated[float, AfterValidator(_price)]


class _RatesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    currency: str = Field(description="ISO 4217 code, e.g. EUR")
    gpu_hour: dict[str, Price]
    energy_kwh: Price = 0.0

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not _CURRENCY.match(v):
            raise ValueError(f"must be a three-letter ISO 4217 code such as EUR, not {v!r}")
        return v

    @field_validator("gpu_hour")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("needs at least one price (a `default` or a GPU model)")
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
