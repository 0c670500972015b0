"""Run test cells the way a notebook does, in whichever environment runs this file (the student kit's, or the
instructor's): for each case, the notebook's setup cells and a version of the exercise cell, then the test cell's
``check(name, fn)``. Reads a JSON job on stdin, prints one JSON object: case -> {"score", "report"}.

Imports nothing but ``autograder`` (whatever that environment installed), so it can run far from the repository.
"""
import contextlib
import io
import json
import sys

from autograder import check


def define(setup: list[str], source: str, name: str):
    namespace = {"__name__": "__main__"}
    for code in setup:
        exec(code, namespace)
    exec(source, namespace)
    return namespace[name]


def main() -> None:
    job = json.load(sys.stdin)
    results = {}
    for exercise, spec in job.items():
        for case, source in spec["cases"].items():
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                score = check(exercise, define(spec["setup"], source, exercise))
            report = printed.getvalue().split("\n(While being checked", 1)[0].strip()
            results[f"{exercise}/{case}"] = {"score": score, "report": report}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
