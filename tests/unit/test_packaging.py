"""Packaging: ranges for the users of the library, exact locked versions for the project's own setup, CI and images.

pyproject.toml states what a service that installs eos-pipeline may combine it with (compatible ranges: an exact pin
there clashes with every other pin in the user's environment); requirements/*.txt (`make lock`) state what this
project installs and tests. These tests keep the two in step without a network.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Each lock and the extras it installs (setup and CI: dev; the two images: service and compaction).
LOCKS = {"dev.txt": ("dev",), "service.txt": (), "compaction.txt": ("spark",)}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The base dependencies and those of `extras`, with the project's references to its own extras followed."""
    found = [Requirement(r) for r in PROJECT["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in map(Requirement, PROJECT["optional-dependencies"][extra]):
            if canonicalize_name(requirement.name) == canonicalize_name(PROJECT["name"]):
                todo.extend(requirement.extras)
            else:
                found.append(requirement)
    return found


def pins(lock: Path) -> dict[str, tuple[Version, bool]]:
    """name -> (pinned version, whether a hash follows), for every `name==version` line of a uv/pip-tools lock."""
    lines = lock.read_text().splitlines()
    found: dict[str, tuple[Version, bool]] = {}
    for i, line in enumerate(lines):
        if match := PIN.match(line):
            hashed = i + 1 < len(lines) and lines[i + 1].strip().startswith("--hash=sha256:")
            found[canonicalize_name(match[1])] = (Version(match[2]), hashed)
    return found


def all_requirements() -> list[Requirement]:
    return requirements(tuple(PROJECT["optional-dependencies"]))


@pytest.mark.parametrize("requirement", all_requirements(), ids=str)
def test_every_dependency_is_a_compatible_range_not_a_pin(requirement: Requirement) -> None:
    operators = {spec.operator for spec in requirement.specifier}
    assert not operators & {"==", "==="}, f"{requirement}: an exact pin belongs in requirements/ (`make lock`)"
    assert operators & {">=", "~="}, f"{requirement}: give the lowest version tested as a lower bound (>=)"
    assert operators & {"<", "~="}, f"{requirement}: give the next incompatible (major) version as a bound (<)"


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_lock_pins_every_dependency_it_installs_within_its_range_with_hashes(lock: str) -> None:
    pinned = pins(REPO / "requirements" / lock)
    for requirement in requirements(LOCKS[lock]):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not in requirements/{lock}: run `make lock`"
        version, hashed = pinned[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{lock} pins {name}=={version} outside {requirement}: run `make lock`"
        )
        assert hashed, f"requirements/{lock}: {name} has no --hash (pip installs it with --require-hashes)"
    assert canonicalize_name(PROJECT["name"]) not in pinned, "the project itself is installed from the source tree"


def test_the_image_locks_ship_the_versions_ci_tests() -> None:
    dev = pins(REPO / "requirements" / "dev.txt")
    for lock in ("service.txt", "compaction.txt"):
        for name, (version, _) in pins(REPO / "requirements" / lock).items():
            assert dev.get(name, (version,))[0] == version, f"{lock} pins {name}=={version}, dev.txt {dev[name][0]}"


def test_setup_ci_and_the_images_install_from_the_locks() -> None:
    setup = (REPO / "deploy" / "local" / "setup.sh").read_text()
    assert "LOCK=requirements/dev.txt" in setup
    assert '--require-hashes -r "$LOCK"' in setup
    assert "--no-deps -e ." in setup
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci and re.search(r"^test: setup$", (REPO / "Makefile").read_text(), re.M)
    installs = [line for line in (REPO / "Dockerfile").read_text().splitlines() if re.match(r"RUN .*pip install", line)]
    assert installs, "the Dockerfile installs nothing with pip?"
    for line in installs:
        locked = re.search(r"--require-hashes -r /src/requirements\.txt", line)
        assert locked or "--no-deps" in line, f"Dockerfile resolves versions of its own: {line}"
    copied = re.findall(r"COPY requirements/(\w+\.txt) ", (REPO / "Dockerfile").read_text())
    assert sorted(copied) == ["compaction.txt", "service.txt"]
