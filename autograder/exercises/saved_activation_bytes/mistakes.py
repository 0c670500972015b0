"""The known mistakes of ``saved_activation_bytes`` and their fingerprints in the counts (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/saved_activation_bytes.py
(tests/exercises/test_diagnosis.py). Each scenario records the count and its type; the sizes are in the reference's case, so a
fingerprint knows the bytes of an input, a weight or a buffer exactly.
"""
from ..judging.diagnosis import EVERY, Mistake, ran
from ..judging.localise import Locate

KEYS = ("linear", "buffer", "slice", "block_sdpa", "block_bf16_dropout")


def _got(student, key) -> float:
    value = ran(student, key)["bytes"]
    if value is None:
        raise KeyError(key)
    return float(value)


def _want(reference, key) -> float:
    return float(reference["scenarios"][key]["bytes"])


def _case(reference, key) -> dict:
    return reference["scenarios"][key]["case"]


def _right(student, reference, *keys) -> bool:
    return all(_got(student, key) == _want(reference, key) for key in keys)


def parameters_counted(student, reference):
    c = _case(reference, "linear")
    weight = 4 * c["d_out"] * c["d_in"]
    if _got(student, "linear") == _want(reference, "linear") + weight:
        return f"on the nn.Linear your count is the reference's plus {weight:,} bytes: its weight"
    return None


def buffers_counted(student, reference):
    gain = 4 * _case(reference, "buffer")["width"]
    if _right(student, reference, "linear") and _got(student, "buffer") == _want(reference, "buffer") + gain:
        return f"on the layer with a buffer your count is {gain} bytes more than the reference's: the buffer"
    return None


def view_bytes_instead_of_storage_bytes(student, reference):
    c = _case(reference, "slice")
    if _got(student, "slice") == 4 * c["rows"] * c["keep"] != _want(reference, "slice"):
        return "on the slice your count is the slice's own bytes, not its whole storage's"
    return None


def views_counted_twice(student, reference):
    if _right(student, reference, "linear", "buffer", "slice") and _got(student, "block_sdpa") > _want(reference, "block_sdpa"):
        return "the small layers are right, but on the transformer block your count is too large: a storage counted twice"
    return None


def inputs_left_out(student, reference):
    c = _case(reference, "linear")
    if _got(student, "linear") == _want(reference, "linear") - 4 * c["batch"] * c["d_in"] and _got(student, "slice") == 0:
        return "on the nn.Linear and on the slice your count leaves out the input"
    return None


def returns_megabytes(student, reference):
    if all(abs(_got(student, key) * 2**20 - _want(reference, key)) < 1 for key in KEYS) and _want(reference, "linear"):
        return "every count is the reference's divided by 2**20: mebibytes, not bytes"
    return None


def a_constant(student, reference):
    values = {_got(student, key) for key in KEYS}
    if len(values) == 1 and values != {0.0}:
        return "your function returned the same number for every layer"
    return None


def does_nothing(student, reference):
    if all(_got(student, key) == 0 for key in KEYS):
        return "your function returned 0 for every layer"
    return None


MISTAKES = [
    Mistake("parameters_counted", "You count the module's parameters among the saved tensors (or leave them out by "
            "identity, `t is p`, which misses the views of them that ops save).",
            "Parameters live as long as the model; the question is what autograd keeps for this forward.",
            "Leave out every storage of module.parameters() and module.buffers(), compared by "
            "untyped_storage().data_ptr().", parameters_counted, variants=("parameters_excluded_by_identity",)),
    Mistake("buffers_counted", "You leave out the parameters but count the buffers.",
            "Buffers belong to the module too: they live as long as it, whatever the forward saves.",
            "Leave out module.buffers() as well.", buffers_counted),
    Mistake("view_bytes_instead_of_storage_bytes", "You count a saved view by its own bytes.",
            "A view keeps its whole storage alive: that is what the memory holds.",
            "Count t.untyped_storage().nbytes().", view_bytes_instead_of_storage_bytes),
    Mistake("views_counted_twice", "You count every saved tensor, also several views of one storage.",
            "q, k and v are views of one storage (and some tensors are saved by several ops): the memory holds it "
            "once.", "Key the counts by untyped_storage().data_ptr() so that each storage counts once.",
            views_counted_twice),
    Mistake("inputs_left_out", "You leave the inputs out of the count.",
            "What the forward saves includes its inputs (nn.Linear saves x): autograd keeps them for backward.",
            "Count every saved storage but the module's parameters and buffers, the inputs included.",
            inputs_left_out),
    Mistake("returns_megabytes", "You return mebibytes.", "The contract is bytes, as a Python int.",
            "Return the sum of the storages' sizes without dividing.", returns_megabytes),
    Mistake("a_constant", "Your function returns a constant.", "Nothing in it counts what the forward saves.",
            "Run the module under saved_tensors_hooks and count what the pack hook sees.", a_constant, includes=EVERY),
    Mistake("does_nothing", "Your function returns 0.", "Nothing in it counts what the forward saves.",
            "Run the module under torch.autograd.graph.saved_tensors_hooks and sum the storages the pack hook sees.",
            does_nothing, includes=EVERY),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"bytes": "the byte count", "type": "the returned type"},
                factors=lambda case: {"4 (bytes per float32)": 4, "the batch size": case["batch"]})
