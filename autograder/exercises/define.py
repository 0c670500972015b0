"""Turn notebook cells into a function: run the cells in a fresh namespace, return the name."""
import errno


class DefinitionError(Exception):
    """The cells could not be run, or did not define the function. The message is for the student."""


def define_function(cells: list[tuple[str, str]], name: str):
    """Run ``(label, source)`` cells in order in one namespace and return ``namespace[name]``."""
    namespace = {"__name__": "__main__"}
    for label, source in cells:
        try:
            code = compile(source, f"<{label}>", "exec")
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
