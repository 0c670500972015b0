"""An instructor's second look: what in an exercise cell deserves a human read (never an automatic zero).

The grade never depends on how code is written; these findings only go to the class report, so that an instructor
can review a cell that reaches into the grader, uses a library the exercise asks students to write themselves, or
patches modules at run time. Read from the cell's syntax tree (``ast``), never by running it.
"""
import ast
from dataclasses import dataclass

GRADER_MODULES = ("autograder", "coursekit.dist")
FORBIDDEN_NAMES = {  # names of library implementations an exercise asks the student to write themselves
    "DistributedDataParallel": "torch's DistributedDataParallel",
    "fully_shard": "torch's FSDP2 (fully_shard)",
    "FullyShardedDataParallel": "torch's FSDP",
    "parallelize_module": "torch's tensor parallelism (parallelize_module)",
    "ColwiseParallel": "torch's tensor parallelism (ColwiseParallel)",
    "RowwiseParallel": "torch's tensor parallelism (RowwiseParallel)",
    "DTensor": "torch's DTensor",
    "distribute_tensor": "torch's DTensor",
    "ZeroRedundancyOptimizer": "torch's ZeroRedundancyOptimizer",
    "context_parallel": "torch's context parallelism",
    "scaled_dot_product_attention": "torch's scaled_dot_product_attention",
}
INTROSPECTION = {  # module attribute -> why a grading cell has no use for it
    ("gc", "get_objects"): "walks every live object",
    ("gc", "get_referrers"): "walks every live object",
    ("sys", "modules"): "reaches loaded modules by name",
    ("sys", "_getframe"): "reads the caller's frames",
    ("inspect", "currentframe"): "reads the caller's frames",
    ("inspect", "stack"): "reads the caller's frames",
    ("os", "kill"): "signals other processes",
    ("os", "killpg"): "signals other processes",
    ("ctypes", "CDLL"): "calls C functions directly",
    ("importlib", "reload"): "reloads modules",
}


@dataclass(frozen=True)
class Finding:
    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


def audit(source: str) -> list[Finding]:
    """Findings for one exercise cell, in line order (empty when nothing stands out or it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    modules = set()   # names bound to imported modules in this cell
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                if name.startswith(GRADER_MODULES):
                    found.append(Finding(node.lineno, f"imports the grader's own module {name}"))
            for alias in node.names:
                if alias.name in FORBIDDEN_NAMES:
                    found.append(Finding(node.lineno, f"imports {FORBIDDEN_NAMES[alias.name]}"))
                if isinstance(node, ast.Import):
                    modules.add((alias.asname or alias.name).split(".")[0])
                elif alias.name != "*":
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN_NAMES and isinstance(node.ctx, ast.Load):
                found.append(Finding(node.lineno, f"uses {FORBIDDEN_NAMES[node.attr]}"))
            if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in INTROSPECTION:
                found.append(Finding(node.lineno, f"{node.value.id}.{node.attr}: "
                                                  f"{INTROSPECTION[(node.value.id, node.attr)]}"))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES and isinstance(node.ctx, ast.Load):
            found.append(Finding(node.lineno, f"uses {FORBIDDEN_NAMES[node.id]}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc/"):
            found.append(Finding(node.lineno, "reads /proc (other processes' state)"))
    for node in ast.walk(tree):  # assignments to an attribute of an imported module: a monkeypatch
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in modules:
                found.append(Finding(node.lineno, f"replaces {ast.unparse(target)} (patches a module at run time)"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args \
                and isinstance(node.args[0], ast.Name) and node.args[0].id in modules:
            found.append(Finding(node.lineno, f"setattr on the module {node.args[0].id} (patches a module at run time)"))
    unique = {(f.line, f.what): f for f in found}
    return [unique[k] for k in sorted(unique)][:20]
