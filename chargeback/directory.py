"""The directory file: which department pays for a user or a project.

    users:              # user -> department
      alice: vision-lab
    projects:           # project -> department
      nlp: lang-lab

The user's mapping wins; a user not listed is placed by their project; neither listed
gives the department "unmapped" (the bill lists who landed there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from gpu_audit.yamlload import load_file

UNMAPPED = "unmapped"


class _DirectoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: dict[str, str] = {}
    projects: dict[str, str] = {}

    @field_validator("users", "projects")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k, d in v.items() if not k.strip() or not d.strip()]
        if bad:
            raise ValueError("names and departments must not be empty: " + ", ".join(
                repr(k) for k in bad))
        return v


@dataclass(frozen=True, slots=True)
class Directory:
    users: dict[str, str] = field(default_factory=dict)
    projects: dict[str, str] = field(default_factory=dict)

    def department(self, user: str | None, project: str | None) -> str:
        """The user's department, else the project's, else "unmapped"."""
        if user is not None and user in self.users:
            return self.users[user]
        if project is not None and project in self.projects:
            return self.projects[project]
        return UNMAPPED


def load_directory(path: str | Path | None) -> Directory:
    """Read and validate a directory file (None: everyone is unmapped)."""
    if path is None:
        return Directory()
    f = load_file(_DirectoryFile, Path(path))
    return Directory(dict(f.users), dict(f.projects))
