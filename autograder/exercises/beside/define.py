"""Turn notebook cells into a function: run the cells in a fresh namespace, return the name."""
import errno
import linecache
import traceback

# The file names cells were compiled under (``<your cell `x`>``): a traceback's frames there are the cells' own
# lines, which a crash's feedback quotes; linecache holds their text so that tracebacks show it too.
DEFINED: set[str] = set()


class DefinitionError(Exception):
    """The cells could not be run, or did not define the function. The message is for the student."""


def define_function(cells: list[tuple[str, str]], name: str):
    """Run ``(label, source)`` cells in order in one namespace and return ``namespace[name]``."""
    namespace = {"__name__": "__main__"}
    for label, source in cells:
        try:
            code = compile(source, f"<{label}>", "exec")
            linecache.cache[f"<{label}>"] = (len(source), None, source.splitlines(True), f"<{label}>")
            DEFINED.add(f"<{label}>")
        except SyntaxError as exc:
            raise DefinitionError(f"{label} has a syntax error on line {exc.lineno}: {exc.msg}.") from None
        try:
            exec(code, namespace)
        except OSError as exc:
            if exc.errno == errno.EFBIG:  # the sandbox's file-size limit is also the output limit
                raise DefinitionError(f"Running {label} wrote more output than the grader allows.") from None
            raise DefinitionError(f"Running {label} raised {type(exc).__name__}: {exc}"[:400]) from None
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the cell must not stop grading
            raise DefinitionError(f"Running {label} raised {type(exc).__name__}: {exc}"[:400]) from None
    fn = namespace.get(name)
    if not callable(fn):
        raise DefinitionError(f"After running your cell, `{name}` is not defined as a function.")
    return fn


def cell_line(exc: BaseException) -> dict:
    """Where in the cells an exception came from: the innermost frame of a defined cell (its label, line number
    and text), or {} when none is on the traceback (it came from torch's own checks before any cell ran)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename in DEFINED:
            return {"cell": frame.filename[1:-1][:80], "line": frame.lineno, "code": (frame.line or "").strip()[:120]}
    return {}
