"""The checks of ``saved_activation_bytes``: exact integers, plain Python."""
from ..judging.checking import off_by, scenario, what

HINTS = {
    "linear": "nn.Linear saves its input x (count it: the inputs count) and its weight (a parameter: leave it out).",
    "buffer": "leave out every storage of the module's parameters and buffers (module.parameters() and "
              "module.buffers()), also when an op saves a view of one.",
    "slice": "a view holds on to its whole storage: count t.untyped_storage().nbytes(), not the view's own bytes.",
    "block_sdpa": "q, k and v are views of one storage (the qkv projection's output), and some tensors are saved "
                  "by several ops: count each storage once, keyed by untyped_storage().data_ptr().",
    "block_bf16_dropout": "count every saved storage once by its whole size (dropout's masks are 1 byte an "
                          "element), the input included and the block's parameters left out.",
}


def bytes_problem(student, reference, key: str) -> str | None:
    got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]
    if got["bytes"] is None:
        return f"When {what(reference, key)}, your function returned a {got['type']}, not a number of bytes."
    if float(got["bytes"]) != float(want["bytes"]):
        return (f"When {what(reference, key)}, your count ({int(got['bytes']):,} bytes) is "
                f"{off_by(float(got['bytes']), float(want['bytes']))}: {HINTS[key]}")
    return None


def check_linear(student, reference):
    return bytes_problem(student, reference, "linear")


def check_buffer(student, reference):
    return bytes_problem(student, reference, "buffer")


def check_slice(student, reference):
    return bytes_problem(student, reference, "slice")


def check_block_sdpa(student, reference):
    return bytes_problem(student, reference, "block_sdpa")


def check_block_bf16(student, reference):
    return bytes_problem(student, reference, "block_bf16_dropout")


def check_returns_int(student, reference):
    for key in reference["scenarios"]:
        got = scenario(student, key, what(reference, key))
        if got["type"] != "int":
            return f"Return a Python int (sum of the storages' sizes), not a {got['type']}."
    return None


def counted_right(got: dict, want: dict) -> str | None:
    """The evidence: the count of this seeded layer is exact, which only counting its saved tensors gives."""
    if got.get("bytes") is not None and float(got["bytes"]) == float(want["bytes"]):
        return None
    return f"when {want['case']['what']}, the count is not the layer's."
