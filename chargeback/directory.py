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
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from gpu_audit.yamlload import load_file

UNMAPPED = "unmapped"


def _not_empty(v: str) -> str:
    if not v.strip():
        raise ValueError("names and departments must not be empty")
    return v


# each entry checked on its own, so every bad one is reported with its own line
Name = Annotated[str, AfterValidator(_not_empty)]


class _DirectoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: dict[Name, Name] = {}
    projects: dict[Name, Name] = {}


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
