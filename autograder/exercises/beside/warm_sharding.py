"""DTensor's sharding computations done once in the launcher, before the fork, instead of in every rank.

A DTensor op's first call on new shapes works out its sharding (strategies, a fake-tensor run for the output's
shape) and caches it, keyed on the global shapes, placements and mesh, never on the rank; a fresh rank spends most
of its time building that cache. ``warm`` runs the grader's own work (``run``: e.g. its model, steps, state dicts;
never the student's code) in the launcher on torch's "fake" process group, one per world size, so that every
forked rank inherits the cache. The cached specs point at the mesh the warm-up built, whose rank is the fake
group's 0: each rank rebinds that mesh to its own process group and coordinate (``device_mesh``) and uses it, so a
warm rank computes exactly what a cold one does (tests/exercises/test_checkpointer.py compares them). Where the
launcher already has a process group (a student's kernel in a self-check), nothing is warmed: the ranks start cold.
"""
import contextlib
import warnings

import torch
import torch.distributed as dist

_meshes: dict[int, object] = {}  # world size: the mesh the warm-up's cached specs point at
_warming = [False]


def device_mesh(world_size: int):
    """This rank's 1-D mesh over ``world_size`` ranks: while warming, the warm-up's one (one per world size, so that
    every cached spec points at it); in a rank, the warm-up's mesh rebound to this rank, or a fresh one if none."""
    from torch.distributed.device_mesh import init_device_mesh

    if _warming[0] and world_size in _meshes:
        return _meshes[world_size]
    mesh = init_device_mesh("cpu", (world_size,))
    if _warming[0]:
        _meshes[world_size] = mesh
        return mesh
    warm = _meshes.get(world_size)
    if warm is None:
        return mesh
    return rebind(warm, mesh)


def rebind(warm, mesh):
    """``warm`` made the same as ``mesh`` (private: a DeviceMesh's whole state, its process groups, rank and
    coordinate, copied over), so that the specs cached before the fork compute with this rank's own group."""
    warm.__dict__.update(mesh.__dict__)
    return warm


def fake_group(world_size: int) -> bool:
    """A process group of ``world_size`` whose collectives do nothing (private: torch's testing "fake" backend,
    registered when its module is imported), as rank 0; False where this torch has none."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world_size)
    except Exception:
        return False
    return True


def warm(runs: dict[int, list[dict]], run) -> None:
    """``run(case)`` (the grader's own work) for each case of ``runs`` (world size: cases) on a fake group of that
    size."""
    if dist.is_initialized():
        return
    _warming[0] = True
    try:
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for size in sorted(runs):
                if not fake_group(size):
                    return  # no fake backend in this torch: the ranks start cold
                try:
                    for case in runs[size]:
                        with contextlib.suppress(Exception):  # a cache left cold costs time, never a result
                            run(case)
                finally:
                    dist.destroy_process_group()
    finally:
        _warming[0] = False
