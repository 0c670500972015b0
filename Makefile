# Training at Scale — the two commands a user needs are `make lab` and `make test`.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
PORT   ?= 8888

.PHONY: help env lab nbgrader test test-fast test-any-cpu notebooks check-notebooks student-kit hub hub-down bench gpu-evidence gpu-evidence-dry clean

## help: list the targets, one line each (the first line of each target's `##` comment)
help:
	@sed -n 's/^## \([a-z-]*\): /  \1\t/p' $(firstword $(MAKEFILE_LIST)) | expand -t 22

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

## env: create .venv and install the course (CPU torch 2.13.0, JupyterLab 4, nbgrader 0.9)
env: $(VENV)/.installed

## lab: open JupyterLab on the course (nbgrader's Validate, assignment list and formgrader enabled)
## (the venv's bin goes first on PATH: formgrader runs `alembic` from PATH when it opens the gradebook)
## (Lab's defaults as in the student kit: no news or update pop-ups)
LAB_DEFAULTS := studentkit/jupyter-config/lab-settings/overrides.d/training-at-scale-student.json
lab: env
	install -D -m 644 $(LAB_DEFAULTS) $(VENV)/share/jupyter/lab/settings/overrides.d/training-at-scale.json
	cd classroom && PATH="$(abspath $(VENV))/bin:$$PATH" $(abspath $(VENV))/bin/jupyter lab --port=$(PORT) \
	    --ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/notebooks/00-start-here.ipynb \
	    $(if $(filter 0,$(shell id -u)),--allow-root)

## nbgrader: one nbgrader command on the course, e.g. make nbgrader ARGS="collect lesson1"
## (in classroom/, with the venv's bin on PATH for its `alembic`)
nbgrader: env
	cd classroom && PATH="$(abspath $(VENV))/bin:$$PATH" $(abspath $(VENV))/bin/nbgrader $(ARGS)

## test: lint, check the generated files, run every test (about 27 min on 2 cores; the browser tests need chromium)
## (most of them in TEST_PROCESSES processes side by side (tests/conftest.py: which tests share a process, the costliest
## first) while the fast tier runs again under the CPU kernels other machines pick (test-any-cpu: it fills the cores
## the others leave idle while they wait for a deadlock's timeout or a notebook's kernel), then the `serial` ones alone)
TEST_PROCESSES ?= 2
# the files that mark tests `serial`: the serial steps collect only these (collecting every file costs ~14 s of CPU)
SERIAL_FILES = $(shell grep -rlE 'mark\.serial' tests --include='test_*.py' | sort)
test: env
	$(VENV)/bin/ruff check .
	$(PY) -m autograder generate --check
	mkdir -p test-artifacts; $(PY) tests/any_cpu.py > test-artifacts/any-cpu.txt 2>&1 & any_cpu_pid=$$!; \
	    $(PY) -m pytest -n $(TEST_PROCESSES) -m "not serial"; side_by_side=$$?; \
	    wait $$any_cpu_pid; any_cpu=$$?; cat test-artifacts/any-cpu.txt; \
	    $(PY) -m pytest -m serial $(SERIAL_FILES); alone=$$?; \
	    [ $$side_by_side = 0 ] && [ $$alone = 0 ] && [ $$any_cpu = 0 ]

## test-any-cpu: the fast tier again under ATen's two other CPU kernel levels (e.g. default and AVX2), side by side
test-any-cpu: env
	$(PY) tests/any_cpu.py

## test-fast: the quick tests only (no whole-notebook runs, no browser)
## (side by side in TEST_PROCESSES processes as in `make test`, then its `serial` ones alone, if any: pytest's 5 is "none selected")
FAST := not slow and not browser
test-fast: env
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(TEST_PROCESSES) -m "$(FAST) and not serial"; side_by_side=$$?; \
	    $(PY) -m pytest -m "$(FAST) and serial" $(SERIAL_FILES); alone=$$?; \
	    [ $$side_by_side = 0 ] && { [ $$alone = 0 ] || [ $$alone = 5 ]; }

## notebooks: regenerate notebooks/ (student versions) and the shipped reference observations from solutions/
notebooks: env
	$(PY) -m autograder generate

## check-notebooks: only compare notebooks/, the references and the README's table with solutions/ (as CI does)
check-notebooks: env
	$(PY) -m autograder generate --check

## student-kit: build what students receive (dist/student-kit/: wheel, README, environment.yml; and a zip)
student-kit: env
	$(PY) -m autograder student-kit --out dist/student-kit

## hub: a class on JupyterHub on this machine (as root), http://localhost:8000
## accounts from hub/demo-class.csv, student and instructor environments, nbgrader's exchange, formgrader (docs/teaching-a-class.md)
hub: env
	$(PY) -m hub up --class-list $(or $(CLASS),hub/demo-class.csv)

## hub-down: stop the class hub and remove all it created (its accounts with their homes, groups, files)
hub-down:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m hub down --purge

## bench: serial nbgrader vs the isolated parallel grader on 100 submissions
bench: env
	$(PY) -m bench.grading

## gpu-evidence: record the GPU results the lessons show, on a CUDA machine, with any python3 that holds torch
## (installs nothing; OUT=folder for the results and log, default coursekit/results; ≤ 8 minutes)
gpu-evidence:
	$(PYTHON) -m bench.gpu_evidence --out $(or $(OUT),coursekit/results)

## gpu-evidence-dry: the same command on the CPU (gloo, tiny sizes), into OUT (default /tmp/gpu-evidence-dry)
gpu-evidence-dry: env
	$(PY) -m bench.gpu_evidence --dry-run --out $(or $(OUT),/tmp/gpu-evidence-dry)

## clean: remove the gradebook, the exchange, collected submissions and test artifacts
clean:
	rm -rf classroom/gradebook.db classroom/submitted classroom/autograded \
	       classroom/feedback classroom/exchange test-artifacts .pytest_cache
