"""The student kit as a student gets it: built by the instructor's command, installed into a fresh virtual
environment in an empty folder, used with nothing of the repository on the path."""
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build_kit(out: Path) -> Path:
    """``python -m autograder student-kit --out OUT`` (what ``make student-kit`` runs); returns OUT."""
    done = subprocess.run([sys.executable, "-m", "autograder", "student-kit", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"building the student kit failed:\n{done.stdout}\n{done.stderr}"
    return out


@dataclass
class InstalledKit:
    kit: Path                   # the built kit folder (wheel, README, environment.yml)
    venv: Path                  # a fresh virtual environment with only the kit installed
    home: Path                  # an empty home folder: the student's ~
    install_seconds: float = 0.0
    timings: dict = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """A student's shell: the kit's environment first on PATH, nothing of ours (no PYTHONPATH, no COURSE_ROOT)."""
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8",
                "PYTHONUNBUFFERED": "1", **extra}

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 600, stdin: str | None = None,
            check: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
        program = args[0] if "/" in args[0] else str(self.bin / args[0])
        done = subprocess.run([program, *args[1:]], cwd=cwd or self.home, env=self.env(**extra_env), input=stdin,
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done


def install_kit(kit: Path, where: Path) -> InstalledKit:
    """A fresh venv under ``where`` (an empty folder, away from the repository) with the kit's wheel installed."""
    (wheel,) = kit.glob("*.whl")
    home = where / "home"
    home.mkdir(parents=True)
    installed = InstalledKit(kit, where / "venv", home)
    base_python = getattr(sys, "_base_executable", sys.executable)
    start = time.monotonic()
    subprocess.run([base_python, "-m", "venv", str(installed.venv)], check=True, cwd=where, timeout=300,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    installed.run("pip", "install", "--quiet", str(wheel), timeout=1800,
                  PIP_DISABLE_PIP_VERSION_CHECK="1", **_pip_settings())
    installed.install_seconds = time.monotonic() - start
    return installed


def _pip_settings() -> dict[str, str]:
    """The machine's pip settings (mirrors, the local torch wheel) that a clean environment would otherwise lose."""
    keep = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CERT", "PIP_CONFIG_FILE")
    return {k: v for k, v in os.environ.items() if k in keep}


def provide_torch(venv: Path, where: Path) -> None:
    """This suite's torch (and what it requires) importable in ``venv`` without installing it: for tests of
    install steps other than torch's own (a fresh venv with the kit's wheel, ``install_kit``, installs torch for
    real). pip then sees torch as installed and skips its ~700 MB wheel. A copy (hard links where the file system
    allows) in ``where``, named by a .pth file: pip may upgrade or remove what it finds there, never the originals."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement

    folder = where / "provided-torch"
    folder.mkdir(parents=True)
    todo, done = ["torch"], set()
    while todo:
        dist = distribution(todo.pop())
        if dist.metadata["Name"].lower() in done:
            continue
        done.add(dist.metadata["Name"].lower())
        for top in {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            source, target = Path(dist.locate_file(top)), folder / top
            if target.exists():
                continue
            if source.is_dir():
                shutil.copytree(source, target, copy_function=_link)
            else:
                _link(source, target)
        for text in dist.requires or ():
            req = Requirement(text)
            # setuptools: the venv has its own (pip upgrades it in the venv, as it would without this)
            if (req.marker is None or req.marker.evaluate({"extra": ""})) and req.name != "setuptools":
                todo.append(req.name)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "provided-torch.pth").write_text(f"{folder}\n")


def _link(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)
