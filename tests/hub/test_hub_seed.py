"""``hub.pythonenv.link_installed``, which ``python -m hub up`` uses with TAS_HUB_SEED_SITE (the hub tests do): the
seeded distributions and what they require become installed in a new environment of the system's Python, their
console scripts run that environment's interpreter, and nothing done in the environment touches the originals.
(The whole hub, built that way, is tests/hub/test_hub.py.)
"""
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from hub.pythonenv import EnvBuildError, link_installed, system_python

SITE = Path(sysconfig.get_paths()["purelib"])


@pytest.fixture
def venv(tmp_path):
    try:
        python = system_python()
    except EnvBuildError as exc:
        pytest.skip(str(exc))
    path = tmp_path / "env"
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True)
    (site,) = path.glob("lib/python*/site-packages")
    if site.parent.name != SITE.parent.name:
        pytest.skip(f"the system's Python is {site.parent.name}, this suite's {SITE.parent.name}")
    return path


def test_a_seeded_distribution_and_its_requirements_are_installed_and_linked(venv):
    link_installed(SITE, venv, ("sympy",))  # sympy requires mpmath; it has a console script, isympy
    (site,) = venv.glob("lib/python*/site-packages")
    found = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import importlib.metadata as m, sympy, mpmath\n"
                            "print(m.version('sympy'), m.version('mpmath'), sympy.__file__)"],
                           capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split()
    from importlib.metadata import version

    assert found[:2] == [version("sympy"), version("mpmath")]
    assert found[2].startswith(str(site))
    assert (site / "sympy" / "__init__.py").stat().st_ino == (SITE / "sympy" / "__init__.py").stat().st_ino
    assert not (site / "torch").exists(), "only what was asked for, and what it requires"
    script = (venv / "bin" / "isympy").read_text()
    assert script.splitlines()[0] == f"#!{venv / 'bin' / 'python'}" and os.access(venv / "bin" / "isympy", os.X_OK)

    (site / "sympy" / "__init__.py").unlink()  # what pip does to a package it replaces
    assert (SITE / "sympy" / "__init__.py").is_file()
