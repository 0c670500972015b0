"""The Kubernetes (Zero to JupyterHub) material, checked as far as this machine allows (no Docker engine, no cluster).

* values.yaml, merged over the chart's own defaults as helm merges them, validates against the chart's values
  schema (both vendored from the z2jh chart 4.4.0, see hub/k8s/upstream/SOURCE.md); a misspelt key fails it.
* the hub's extraConfig runs: instructors get their image, the course volume, the instructors' gid and more
  resources; students keep the student image; every user gets their own uid and USER (nbgrader's student id).
* the student image's build steps run in a plain venv: COPY becomes a copy into a scratch root, RUN runs with the
  venv first on PATH, CMD must exist. Not run: FROM (the base image), `useradd`, USER/WORKDIR, and the whole
  instructor image (its `apt-get` and a second full install would add minutes; its COPY sources are checked).
"""
import copy
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml
from kit_helpers import provide_torch

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "hub" / "k8s"


def chart_merge(defaults, values):
    """helm's merge of user values over chart defaults: maps merge key by key, anything else replaces."""
    if isinstance(defaults, dict) and isinstance(values, dict):
        merged = dict(defaults)
        for key, value in values.items():
            merged[key] = chart_merge(defaults.get(key), value) if key in defaults else value
        return merged
    return copy.deepcopy(values)


@pytest.fixture(scope="module")
def schema():
    return yaml.safe_load((K8S / "upstream" / "values.schema.yaml").read_text())


@pytest.fixture(scope="module")
def values():
    defaults = yaml.safe_load((K8S / "upstream" / "values.yaml").read_text())
    return defaults, yaml.safe_load((K8S / "values.yaml").read_text())


def test_values_validate_against_the_charts_schema(schema, values):
    defaults, ours = values
    jsonschema.validate(chart_merge(defaults, ours), schema)  # what `helm install` checks before rendering


def test_a_misspelt_value_is_caught(schema, values):
    defaults, ours = values
    wrong = copy.deepcopy(ours)
    wrong["singleuser"]["memmory"] = wrong["singleuser"].pop("memory")
    with pytest.raises(jsonschema.ValidationError, match="memmory"):
        jsonschema.validate(chart_merge(defaults, wrong), schema)


def test_the_shared_volumes_are_read_write_many():
    claims = [d for d in yaml.safe_load_all((K8S / "volumes.yaml").read_text()) if d["kind"] == "PersistentVolumeClaim"]
    assert {c["metadata"]["name"] for c in claims} == {"training-at-scale-exchange", "training-at-scale-course"}
    assert all(c["spec"]["accessModes"] == ["ReadWriteMany"] for c in claims)


def _spawner(name: str, user_id: int, groups: list[str]):
    user = SimpleNamespace(name=name, id=user_id, groups=[SimpleNamespace(name=g) for g in groups])
    return SimpleNamespace(user=user, environment={}, image="registry.example.edu/training-at-scale-student:0.1.0",
                           volumes=[{"name": "home"}], volume_mounts=[{"name": "home", "mountPath": "/home/jovyan"}],
                           notebook_dir=None, cpu_limit=2, mem_limit="4G")


def test_the_hubs_extra_config_gives_each_role_its_server(values):
    import asyncio

    from traitlets.config import Config

    _, ours = values
    c = Config()
    exec(ours["hub"]["extraConfig"]["training-at-scale"], {"c": c})
    teacher, student = _spawner("instructor1", 1, ["formgrade-training-at-scale"]), _spawner("student1", 2, [])
    for spawner in (teacher, student):
        asyncio.run(c.KubeSpawner.pre_spawn_hook(spawner))
        assert spawner.environment["USER"] == spawner.user.name == spawner.environment["LOGNAME"]
    assert c.KubeSpawner.uid(teacher) != c.KubeSpawner.uid(student) and c.KubeSpawner.uid(student) >= 10000
    assert "instructor" in teacher.image and teacher.notebook_dir == "/srv/course"
    assert {"name": "course", "mountPath": "/srv/course"} in teacher.volume_mounts and teacher.supplemental_gids
    assert "student" in student.image and student.notebook_dir is None
    assert [v["name"] for v in student.volumes] == ["home"], "a student's pod must not mount the course volume"
    subdomain = ours["hub"]["config"]["JupyterHub"]["subdomain_host"]
    assert f"*.{subdomain.split('://')[1]}" in ours["ingress"]["hosts"], "per-user subdomains need the wildcard host"


def dockerfile(path: Path) -> list[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    return [tuple(line.split(None, 1)) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_instructor_images_sources_exist():
    for instruction, argument in dockerfile(K8S / "Dockerfile.instructor"):
        if instruction == "COPY":
            source = argument.split()[0]
            assert (REPO / source).exists(), f"Dockerfile.instructor copies {source}, which does not exist"


@pytest.mark.slow
def test_the_student_images_build_steps_run_in_a_plain_venv(student_kit, tmp_path):
    import sys

    sys.path.insert(0, str(REPO))
    from hub.pythonenv import PIP_SETTINGS, system_python

    python = system_python()
    steps = dockerfile(K8S / "Dockerfile.student")
    base = dict(steps)["FROM"]
    version = subprocess.run([python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             capture_output=True, text=True).stdout.strip()
    assert re.match(rf"python:{re.escape(version)}\b", base), f"the image is {base}, the venv Python {version}"
    scratch, venv = tmp_path / "image-root", tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    # torch preinstalled (a copy of this suite's): under test are the image's steps, not torch's wheel, which
    # installed_kit's fresh venv (same xdist unit) and the hub's student environment install for real
    provide_torch(venv, tmp_path)
    sources = {"dist/student-kit/": student_kit}
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if k in PIP_SETTINGS}}
    moved, not_run = {}, []
    for instruction, argument in steps:
        if instruction == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(argument)))
        elif instruction == "COPY":
            source, dest = argument.split()
            target = scratch / dest.lstrip("/")
            shutil.copytree(sources.get(source, REPO / source), target, dirs_exist_ok=True)
            moved[dest.rstrip("/")] = str(target)
        elif instruction == "RUN" and argument.split()[0] == "useradd":
            not_run.append(argument)
        elif instruction == "RUN":
            command = argument
            for dest, target in moved.items():
                command = command.replace(dest, target)
            done = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=1800)
            assert done.returncode == 0, f"RUN {argument}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        elif instruction == "CMD":
            program = yaml.safe_load(argument)[0]
            assert (venv / "bin" / program).exists(), f"CMD {program} is not installed"
    assert not_run == ["useradd --create-home --uid 1000 --gid 100 jovyan"], not_run
    # run from the scratch folder: `python -c` puts the working directory (here, the repository) on sys.path
    leaks = subprocess.run([str(venv / "bin" / "python"), "-c", "import autograder.authoring.course"], capture_output=True,
                           cwd=tmp_path, env=env)
    assert leaks.returncode != 0, "the student image must not contain the instructor's course module"
