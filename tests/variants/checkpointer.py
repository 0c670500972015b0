"""Submissions for `Checkpointer` (Lesson 9): valid styles and the classic mistakes of a checkpointer.

Each source is a student's exercise cell, run after the notebook's setup cell in every rank.
"""
from variants import EVERY_CHECK

ANOTHER_SIZE = "another number of ranks"
OPTIMIZER = "AdamW's moments"
LOADED = "load() returns"
NO_STEP_LOST = "No step lost"
SAME_SIZE = "same number of ranks"
SHARDS_ONLY = "only its own shards"

# The reference's shape, with one part of the state left out or done another way (each variant says which).
_BODY = '''
class Checkpointer:
    def __init__(self, directory, model, optimizer, loader):
        self.directory, self.model, self.optimizer, self.loader = Path(directory), model, optimizer, loader

    def state(self, step):
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state, LOADER "rng": torch.get_rng_state(), "step": step}

    def save(self, step):
        dcp.save(self.state(step), checkpoint_id=FOLDER)

    def load(self):
        found = latest_complete(self.directory) if FOLDER_IS_STEP else (
            (0, self.directory / "latest") if (self.directory / "latest" / COMPLETE).exists() else None)
        if found is None:
            return None
        state = self.state(0)
        dcp.load(state, checkpoint_id=found[1])
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        RESTORE_LOADER
        RESTORE_RNG
        return state["step"]
'''


def _variant(loader=True, rng=True, step_folders=True) -> str:
    return (_BODY.replace("LOADER ", '"loader": self.loader.state_dict(), ' if loader else "")
            .replace("RESTORE_LOADER", 'self.loader.load_state_dict(state["loader"])' if loader else "pass")
            .replace("RESTORE_RNG", 'torch.set_rng_state(state["rng"])' if rng else "pass")
            .replace("FOLDER_IS_STEP", "True" if step_folders else "False")
            .replace("FOLDER", "step_dir(self.directory, step)" if step_folders else 'self.directory / "latest"'))


CORRECT = {
    "own_layout_and_marker": '''
import os


class Checkpointer:
    """DCP into ckpt-<step>; a checkpoint counts once its .metadata is there (DCP writes it last)."""

    def __init__(self, directory, model, optimizer, loader):
        self.root, self.model, self.optimizer, self.loader = str(directory), model, optimizer, loader

    def _everything(self):
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"app": {"model": model_state, "optimizer": optim_state},
                "position": dict(self.loader.state_dict()), "generator": torch.get_rng_state()}

    def save(self, step):
        state = self._everything()
        state["step"] = torch.tensor(step)
        dcp.save(state, checkpoint_id=os.path.join(self.root, f"ckpt-{step}"))
        if dist.get_rank() == 0:
            print("saved step", step)

    def load(self):
        steps = [int(name.split("-")[1]) for name in os.listdir(self.root)
                 if name.startswith("ckpt-") and os.path.exists(os.path.join(self.root, name, ".metadata"))]
        if not steps:
            return None
        state = self._everything()
        state["step"] = torch.tensor(0)
        dcp.load(state, checkpoint_id=os.path.join(self.root, f"ckpt-{max(steps)}"))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["app"]["model"],
                       optim_state_dict=state["app"]["optimizer"])
        self.loader.load_state_dict(state["position"])
        torch.set_rng_state(state["generator"])
        return int(state["step"])
''',
}

WRONG = {
    "no_rng_saved": (_variant(rng=False), [SAME_SIZE, ANOTHER_SIZE, NO_STEP_LOST]),
    "no_data_position": (_variant(loader=False), [SAME_SIZE, ANOTHER_SIZE, NO_STEP_LOST]),
    "writes_in_place": (_variant(step_folders=False), [ANOTHER_SIZE, LOADED, NO_STEP_LOST, OPTIMIZER]),
    "gathers_on_rank_0": ('''
from torch.distributed.checkpoint.state_dict import StateDictOptions

WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)


class Checkpointer:
    """The whole state gathered on rank 0 and published there as one file; every rank reads it back."""

    def __init__(self, directory, model, optimizer, loader):
        self.directory, self.model, self.optimizer, self.loader = Path(directory), model, optimizer, loader

    def save(self, step):
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=WHOLE)
        if dist.get_rank() == 0:
            publish({"model": model_state, "optim": optim_state, "loader": self.loader.state_dict(),
                     "rng": torch.get_rng_state(), "step": step}, self.directory / f"step_{step:06d}.pt")
        dist.barrier()

    def load(self):
        files = sorted(self.directory.glob("step_*.pt"))
        if not files:
            return None
        state = torch.load(files[-1], weights_only=False)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=WHOLE)
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        return state["step"]
''', [SHARDS_ONLY]),
    "cannot_load_on_another_size": ('''
class Checkpointer:
    """Every rank publishes its own shards with torch.save; rank 0 marks the step complete afterwards."""

    def __init__(self, directory, model, optimizer, loader):
        self.directory, self.model, self.optimizer, self.loader = Path(directory), model, optimizer, loader

    def save(self, step):
        folder = step_dir(self.directory, step)
        folder.mkdir(parents=True, exist_ok=True)
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        publish({"model": model_state, "optim": optim_state, "loader": self.loader.state_dict(),
                 "rng": torch.get_rng_state(), "step": step}, folder / f"rank{dist.get_rank()}.pt")
        dist.barrier()
        if dist.get_rank() == 0:
            publish(step, folder / COMPLETE)

    def load(self):
        found = latest_complete(self.directory)
        if found is None:
            return None
        state = torch.load(found[1] / f"rank{dist.get_rank()}.pt", weights_only=False)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        return state["step"]
''', [ANOTHER_SIZE, LOADED, NO_STEP_LOST, OPTIMIZER]),
    "optimizer_not_resharded": ('''
from torch.distributed.checkpoint.state_dict import set_model_state_dict


class Checkpointer:
    """The model through DCP; AdamW's state per rank with torch.save, used only on the world size that wrote it."""

    def __init__(self, directory, model, optimizer, loader):
        self.directory, self.model, self.optimizer, self.loader = Path(directory), model, optimizer, loader

    def save(self, step):
        folder = step_dir(self.directory, step)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"optim": self.optimizer.state_dict(), "world_size": dist.get_world_size()},
                   folder / f"optim_rank{dist.get_rank()}.pt")
        state = {"model": get_state_dict(self.model, self.optimizer)[0], "loader": self.loader.state_dict(),
                 "rng": torch.get_rng_state(), "step": step}
        dcp.save(state, checkpoint_id=folder)

    def load(self):
        found = latest_complete(self.directory)
        if found is None:
            return None
        state = {"model": get_state_dict(self.model, self.optimizer)[0], "loader": self.loader.state_dict(),
                 "rng": torch.get_rng_state(), "step": 0}
        dcp.load(state, checkpoint_id=found[1])
        set_model_state_dict(self.model, state["model"])
        mine = found[1] / f"optim_rank{dist.get_rank()}.pt"
        if mine.exists():
            saved = torch.load(mine, weights_only=False)
            if saved["world_size"] == dist.get_world_size():
                self.optimizer.load_state_dict(saved["optim"])
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        return state["step"]
''', [ANOTHER_SIZE, OPTIMIZER]),
    # Issue 37's red team: no state saved at all. Each save publishes only its step number (atomically, and some
    # padding for the memory scenario's disk reading); load() rebuilds the state by running the grader's own
    # training steps from the seeded start on the new ranks. Its values are the trained ones only while every step
    # follows from the case's seeds: the launcher's answer at each save's gate weighs the next step's samples.
    "replays_training_in_load": ('''
import os

import autograder.exercises.checkpointer.observe as grader


class Checkpointer:
    def __init__(self, directory, model, optimizer, loader):
        self.directory, self.model, self.optimizer, self.loader = Path(directory), model, optimizer, loader

    def save(self, step):
        if dist.get_rank() == 0:
            (self.directory / "padding").write_bytes(bytes(7 << 20))
            (self.directory / "step.tmp").write_text(str(step))
            os.replace(self.directory / "step.tmp", self.directory / "step")
        dist.barrier()

    def load(self):
        path = self.directory / "step"
        if not path.exists():
            return None
        step = int(path.read_text())
        for _ in range(step):
            grader.train_step(self.model, self.optimizer, self.loader)
        return step
''', [SAME_SIZE, ANOTHER_SIZE, LOADED, NO_STEP_LOST, OPTIMIZER]),
    "does_nothing": ('''
class Checkpointer:
    def __init__(self, directory, model, optimizer, loader):
        pass

    def save(self, step):
        pass

    def load(self):
        return None
''', EVERY_CHECK),
    "not_implemented": ('''
class Checkpointer:
    def __init__(self, directory, model, optimizer, loader):
        # YOUR CODE HERE
        raise NotImplementedError()

    def save(self, step):
        # YOUR CODE HERE
        raise NotImplementedError()

    def load(self):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
