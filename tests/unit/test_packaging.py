"""Packaging: ranges for the users of the library, exact locked versions for the project's own setup, CI and images.

pyproject.toml states what a service that installs eos-pipeline may combine it with (compatible ranges: an exact pin
there clashes with every other pin in the user's environment); requirements/*.txt (`make lock`) state what this
project installs and tests. These tests keep the two in step without a network.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Each lock and the extras it installs (setup and CI: dev; the two images: service, with [disk], and compaction).
LOCKS = {"dev.txt": ("dev",), "service.txt": ("disk",), "compaction.txt": ("spark",)}
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


# --- what the wheel carries, and what the [test] extra needs ---------------------------------------------------------

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "pipeline", "snapshots")
# What a service's test imports: the fixture, the driver, the App and the serdes.
USER_TEST_IMPORTS = "pipeline.testing.pytest_plugin pipeline.testing.driver pipeline.app pipeline.serde"


def venv_tool(name: str) -> Path:
    """A tool of the dev lock, beside this interpreter (`make setup` installs it)."""
    tool = Path(sys.executable).parent / name
    if not tool.exists():
        pytest.fail(f"{tool} missing: `make setup` installs requirements/dev.txt")
    return tool


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the sources (no build/ left in the tree), and the build's output."""
    import setuptools

    assert Version(setuptools.__version__) >= Version("77"), "`make setup` installs the dev lock's setuptools"
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name, **({"ignore": ignore} if (REPO / name).is_dir() else {}))
    build = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)]
    result = subprocess.run(build, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    [built] = out.glob("eos_pipeline-*.whl")
    return built, result.stdout + result.stderr


def test_the_wheel_ships_py_typed_and_the_license_and_builds_without_warnings(wheel: tuple[Path, str]) -> None:
    path, output = wheel
    warnings = sorted(set(re.findall(r"\b[A-Z]\w*Warning\b.*", output)))
    assert not warnings, f"the build warns (every user's install shows it): {warnings}"
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    assert {"pipeline/py.typed", "snapshots/py.typed"} <= names, "PEP 561: type checkers skip a package without it"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert metadata["License-Expression"] == PROJECT["license"] == "Apache-2.0"
    assert not {n.split("/")[0] for n in names} & {"tests", "tools", "deploy"}


def distribution_closure(requirements_: list[Requirement]) -> set[str]:
    """Every distribution that installing `requirements_` brings, from the installed packages' metadata."""
    todo = [(r, r.extras) for r in requirements_]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        for line in metadata.distribution(name).requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *extras}):
                todo.append((sub, sub.extras))
    return {name for name, _ in seen}


def imported_distributions(code: str) -> set[str]:
    """The distributions whose modules a fresh interpreter has loaded after `code` (start-up's own left out)."""
    # Modules without a file (built-ins, Cython's cython_runtime) belong to no distribution.
    show = "import sys; print(*{n.partition('.')[0] for n, m in sys.modules.items() if getattr(m, '__file__', 0)})"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-c"]
    baseline = set(subprocess.run([*run, show], capture_output=True, text=True, check=True, env=env).stdout.split())
    after = subprocess.run([*run, f"{code}\n{show}"], capture_output=True, text=True, check=True, env=env, cwd=REPO)
    by_module = metadata.packages_distributions()
    own = {"pipeline"}
    found = set()
    # sysconfig's data module is the standard library's, under a platform-dependent name stdlib_module_names lacks.
    stdlib = {m for m in after.stdout.split() if m.startswith("_sysconfigdata_")} | set(sys.stdlib_module_names)
    for module in set(after.stdout.split()) - baseline - own - stdlib:
        assert module in by_module, f"{module} is imported but belongs to no installed distribution"
        found.update(canonicalize_name(d) for d in by_module[module])
    return found


def test_the_driver_and_the_pytest_plugin_need_only_the_base_and_test_dependencies() -> None:
    allowed = distribution_closure(requirements(("test",)))
    used = imported_distributions(f"import {', '.join(USER_TEST_IMPORTS.split())}")
    assert "pytest" in used  # the plugin is a pytest fixture: the import really happened
    assert used <= allowed, f"imported outside eos-pipeline[test]: {sorted(used - allowed)}; declare them in `test`"


def test_a_venv_with_only_the_test_extra_runs_a_service_test_with_the_plugin(
    wheel: tuple[Path, str], tmp_path: Path
) -> None:
    """A real install of the wheel with [test] (exact versions from the lock; uv's cache makes it seconds)."""
    uv, venv = venv_tool("uv"), tmp_path / "venv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    install = [str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
    install += [f"eos-pipeline[test] @ {wheel[0].as_uri()}", "-c", str(REPO / "requirements" / "dev.txt")]
    subprocess.run(install, check=True, timeout=600)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["pipeline.testing.pytest_plugin"]\n')
    (tmp_path / "test_service.py").write_text(SERVICE_TEST)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    run = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_service.py"]
    result = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    installed = subprocess.run(
        [str(uv), "pip", "freeze", "--python", str(venv / "bin" / "python")], capture_output=True, text=True, check=True
    ).stdout
    assert not re.search(r"^(pyspark|pyarrow|pandas|numpy)==", installed, re.M), installed


SERVICE_TEST = """
import pipeline
from pipeline.app import App, Output


def process(state, record):
    state[record.key] = state.get(record.key, 0) + record.value["amount"]
    return [Output(key=record.key, value={"sum": state[record.key]})]


app = App(name="sums", input_topic="in", output_topic="out", process=process)


def test_sums(pipeline_driver):
    assert "site-packages" in pipeline.__file__  # the installed wheel, not a checkout
    driver = pipeline_driver(app)
    driver.send("a", {"amount": 2})
    assert driver.send("a", {"amount": 3})[0].value == {"sum": 5}
"""


def test_the_readme_library_section_names_real_extras_the_plugin_and_working_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert "## Clone it as a template" in readme
    section = readme.partition("## Use it as a library")[2].partition("\n## ")[0]
    assert section, "README: the 'Use it as a library' section"
    extras = set(re.findall(r"eos-pipeline\[(\w+)\]", section))
    assert extras == {"test", "spark"} and extras <= set(PROJECT["optional-dependencies"])
    assert 'pytest_plugins = ["pipeline.testing.pytest_plugin"]' in section
    assert (REPO / "pipeline" / "testing" / "pytest_plugin.py").is_file()
    for module in re.findall(r"`python -m (\w+)`", section):
        run = [sys.executable, "-m", module, "--help"]
        result = subprocess.run(run, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        assert result.returncode == 0, f"`python -m {module}` does not run: {result.stderr}"
    assert set(re.findall(r"`(\w+)` \(`python -m", section)) <= set(PROJECT["scripts"])
