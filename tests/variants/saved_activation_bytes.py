"""Submissions for `saved_activation_bytes`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell, run after Lesson 7's setup cell (math, torch, F, nn). A
wrong entry names the checks (by a phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

CORRECT = {
    "storage_set_and_list": '''
def saved_activation_bytes(module, *inputs):
    skip = set()
    for t in list(module.parameters()) + list(module.buffers()):
        skip.add(t.untyped_storage().data_ptr())
    seen, total = set(), []

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total.append(s.nbytes())
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with torch.set_grad_enabled(True):
            out = module(*inputs)
    del out
    return int(sum(total))
''',
    "keeps_tensors_then_counts_after": '''
import torch


def saved_activation_bytes(module, *inputs):
    """Collect the saved tensors first; count distinct storages afterwards (prints a summary, as students do)."""
    kept = []
    with torch.enable_grad():
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            output = module(*inputs)
    own = {p.untyped_storage().data_ptr() for p in module.state_dict(keep_vars=True).values()}
    storages = {}
    for t in kept:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            storages[ptr] = t.untyped_storage().nbytes()
    print(f"{len(kept)} saved tensors, {len(storages)} distinct storages")
    return sum(storages.values())
''',
    "named_parameters_with_duplicates_and_class_hooks": '''
class _Counter:
    def __init__(self, exclude):
        self.exclude, self.sizes = exclude, {}

    def pack(self, tensor):
        ptr = tensor.untyped_storage().data_ptr()
        if ptr not in self.exclude:
            self.sizes.setdefault(ptr, tensor.untyped_storage().nbytes())
        return tensor

    @staticmethod
    def unpack(tensor):
        return tensor


def saved_activation_bytes(module, *inputs):
    exclude = {p.untyped_storage().data_ptr() for _, p in module.named_parameters(remove_duplicate=False)}
    exclude |= {b.untyped_storage().data_ptr() for _, b in module.named_buffers()}
    counter = _Counter(exclude)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack), torch.enable_grad():
        module(*inputs)
    return sum(counter.sizes.values())
''',
}

_REFERENCE_STYLE = '''
def saved_activation_bytes(module, *inputs):
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    inputs_ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        KEEP
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(saved.values())
'''


def _counting(keep: str) -> str:
    return _REFERENCE_STYLE.replace("KEEP", keep)


WRONG = {
    "views_counted_twice": (_counting('''if storage.data_ptr() not in own:
            saved[id(t)] = storage.nbytes()  # one entry per saved tensor: views of one storage add up'''),
                            ["each storage once"]),
    "parameters_counted": (_counting("saved[storage.data_ptr()] = storage.nbytes()"),
                           ["parameters and buffers out"]),
    "buffers_counted": (_counting('''params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()'''), ["parameters and buffers out"]),
    "view_bytes_instead_of_storage_bytes": (_counting('''if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = t.numel() * t.element_size()'''), ["whole storage"]),
    "inputs_left_out": (_counting('''if storage.data_ptr() not in own and storage.data_ptr() not in inputs_ptrs:
            saved[storage.data_ptr()] = storage.nbytes()'''), ["input included"]),
    "parameters_excluded_by_identity": (_counting('''if not any(t is p for p in module.parameters()):
            saved[storage.data_ptr()] = storage.nbytes()'''), ["parameters and buffers out"]),
    "returns_megabytes": ('''
def saved_activation_bytes(module, *inputs):
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(saved.values()) / 2**20
''', ["nn.Linear", "Python int"]),
    "a_constant": ('''
def saved_activation_bytes(module, *inputs):
    return 123_456
''', EVERY_CHECK),
    "does_nothing": ('''
def saved_activation_bytes(module, *inputs):
    module(*inputs)
    return 0
''', EVERY_CHECK),
    "not_implemented": ('''
def saved_activation_bytes(module, *inputs):
    # YOUR CODE HERE
    raise NotImplementedError()
''', EVERY_CHECK),
}
