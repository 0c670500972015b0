"""Class grading on a Dask cluster: one task per student, the same function as on local threads.

Every Dask worker needs this course installed (``pip install -e .`` of the same commit) and, for
isolation, Debian's ``bubblewrap``. The sandbox is chosen on the worker's machine, where it runs, with the
devices the grader decided (a GPU only if the references were observed with one).
"""
from functools import cache

from .grading import grade_submission
from .sandbox.launch import Limits, Sandbox, make_sandbox


@cache
def _remote_sandbox(enabled: bool, limits: Limits, uid, cuda: bool) -> Sandbox:
    """This machine's sandbox, with the devices the reference was observed with: a Dask worker without the
    grader's GPU stops the batch with a reason rather than charge its students for CUDA scenarios."""
    sandbox = make_sandbox(enabled, limits, uid, gpu=cuda)
    if sandbox.devices.cuda != cuda:
        raise RuntimeError(f"this Dask worker has {sandbox.devices.describe()}, but the references were observed "
                           "with a GPU: give every worker a GPU, or grade with --cpu-only")
    return sandbox


def _grade_remote(sub, course, wanted, references, enabled: bool, limits: Limits, uid, timeout, cuda: bool = False,
                  notebooks=None):
    return grade_submission(sub, course, wanted, references, _remote_sandbox(enabled, limits, uid, cuda), timeout,
                            notebooks)


def grade_on_dask(address: str, todo, course, wanted, references, sandbox: Sandbox, timeout, notebooks=None):
    """Yield (submission, (rows, timings)) as the cluster finishes them. ``address="local"`` starts a local cluster."""
    from distributed import Client, LocalCluster, as_completed

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) \
        if address == "local" else None
    client = Client(cluster or address)
    try:
        futures = {client.submit(_grade_remote, sub, course, wanted, references, sandbox.mode != "off",
                                 sandbox.limits, sandbox.uid, timeout, sandbox.devices.cuda,
                                 (notebooks or {}).get(sub.student), pure=False, key=f"grade-{i}"): sub
                   for i, sub in enumerate(todo)}
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
