"""Class grading on a Dask cluster: one task per student, the same function as on local threads.

Every Dask worker needs this course installed (``pip install -e .`` of the same commit) and, for
isolation, Debian's ``bubblewrap``. The sandbox is chosen on the worker's machine, where it runs.
"""
from .grading import grade_submission
from .sandbox import Limits, Sandbox, make_sandbox


def _grade_remote(sub, course, wanted, references, enabled: bool, limits: Limits, uid, timeout):
    return grade_submission(sub, course, wanted, references, make_sandbox(enabled, limits, uid), timeout)


def grade_on_dask(address: str, todo, course, wanted, references, sandbox: Sandbox, timeout):
    """Yield (submission, (rows, timings)) as the cluster finishes them. ``address="local"`` starts a local cluster."""
    from distributed import Client, LocalCluster, as_completed

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) \
        if address == "local" else None
    client = Client(cluster or address)
    try:
        futures = {client.submit(_grade_remote, sub, course, wanted, references, sandbox.mode != "off",
                                 sandbox.limits, sandbox.uid, timeout, pure=False, key=f"grade-{i}"): sub
                   for i, sub in enumerate(todo)}
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
