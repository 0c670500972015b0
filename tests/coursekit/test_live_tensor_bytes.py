"""coursekit.memory.live_tensor_bytes: memory over time from the storages that are alive, whoever frees them."""
import threading

import torch

from coursekit.memory import live_tensor_bytes


def test_counts_allocations_views_and_frees():
    with live_tensor_bytes("cpu") as live:
        a = torch.ones(1000)  # 4,000 bytes
        view = a[10:]
        b = a * 2
        assert live.timeline[-1][1] == 8000
        del a
        torch.zeros(1)  # any op samples again: `a`'s storage lives on in its view
        assert live.timeline[-1][1] == 8000 + 4
        del view, b
        torch.zeros(1)
    assert live.timeline[-1][1] == 4


def test_a_free_on_another_thread_and_a_resized_storage_count():
    with live_tensor_bytes("cpu") as live:
        kept = [torch.ones(1000)]
        other = threading.Thread(target=kept.clear)  # the last reference dies on another thread (as on gloo's)
        other.start()
        other.join()
        resized = torch.ones(500)
        resized.untyped_storage().resize_(0)  # FSDP frees gathered parameters this way
        torch.zeros(1)
    assert live.timeline[-1][1] == 4


def test_marks_and_windows():
    with live_tensor_bytes("cpu") as live:
        x = torch.ones(100)
        live.mark("start")
        y = torch.ones(100)
        live.mark("end")
    (start, _), (end, _) = live.marks
    window = live.between(start, end)
    assert window[0] == (0.0, 400) and window[-1][1] == 800
    assert live.at(end) == 800
    del x, y
