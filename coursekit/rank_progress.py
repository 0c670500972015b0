"""A progress bar in the notebook for work that runs in forked ranks (Lesson 6's capstone).

A forked rank must not draw a tqdm bar itself: the widget would talk to the notebook through the parent's
sockets, and a text bar goes to stderr. Instead the ranks add to a shared counter, and a small thread of the
parent moves a ``tqdm.auto`` bar from it while ``launch`` waits for the ranks. (``launch`` itself stays on
the main thread: ranks forked from another thread upset the profiler's start-up checks.) The counter has
tqdm's ``update(n)`` method, so the training code is the same as under ``torchrun`` with a real tqdm bar.
"""
import threading
from multiprocessing import get_context

from tqdm.auto import tqdm

from .dist import launch


class SharedCounter:
    """What the ranks see: ``update(n)`` adds to a counter shared with the parent."""

    def __init__(self):
        self._value = get_context("fork").Value("q", 0)

    def update(self, n: int = 1) -> None:
        with self._value.get_lock():
            self._value.value += n

    @property
    def value(self) -> int:
        return self._value.value


def launch_with_progress(fn, world_size: int, *args, total: int, desc: str, **launch_kwargs) -> list:
    """``launch(fn, world_size, *args, counter)`` with a progress bar of ``total`` counter updates.

    ``fn`` gets the counter as its last argument; only what the ranks add to it moves the bar
    (usually rank 0 calls ``counter.update()`` once per step).
    """
    counter, finished = SharedCounter(), threading.Event()
    with tqdm(total=total, desc=desc) as bar:

        def follow():
            while not finished.wait(0.1):
                bar.update(min(counter.value, total) - bar.n)

        poller = threading.Thread(target=follow, name="progress", daemon=True)
        poller.start()
        try:
            return launch(fn, world_size, *args, counter, **launch_kwargs)
        finally:
            finished.set()
            poller.join()
            bar.update(min(counter.value, total) - bar.n)
