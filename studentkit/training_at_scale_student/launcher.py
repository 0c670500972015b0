"""``training-at-scale``: put the lessons in a folder of yours and open JupyterLab on the start page.

    training-at-scale lab [--dir ~/training-at-scale] [--port 8888] [--no-browser]
    training-at-scale copy [--dir ~/training-at-scale]      # only copy the lessons

Copying never overwrites: a lesson you already have stays as it is (a newer kit's version of it is reported, and
can be fetched by renaming your copy and running the command again).
"""
import argparse
import os
import sys
from pathlib import Path

from . import lessons

START_PAGE = "00-start-here.ipynb"
DEFAULT_DIR = Path.home() / "training-at-scale"


def copy_lessons(target: Path) -> tuple[list[str], list[str]]:
    """Copy every shipped lesson file missing under ``target``; returns (copied, kept-but-different)."""
    copied, kept = [], []

    def walk(folder, rel: Path):
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.startswith((".", "__")):
                continue
            if entry.is_dir():
                walk(entry, rel / entry.name)
                continue
            dest = target / rel / entry.name
            data = entry.read_bytes()
            if dest.exists():
                if dest.read_bytes() != data:
                    kept.append(str(rel / entry.name))
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            copied.append(str(rel / entry.name))

    walk(lessons(), Path())
    return copied, kept


def _report(target: Path, copied: list[str], kept: list[str]) -> None:
    print(f"Course folder: {target}")
    if copied:
        print(f"  copied {len(copied)} file(s) of the course into it")
    if kept:
        print(f"  kept your own version of {len(kept)} file(s) that this kit ships differently: "
              + ", ".join(kept[:5]) + (" …" if len(kept) > 5 else ""))


def lab_command(target: Path, port: int | None, open_browser: bool) -> list[str]:
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={target}",
               f"--LabApp.default_url=/lab/tree/{START_PAGE}"]
    if port:
        command.append(f"--ServerApp.port={port}")
    if not open_browser:
        command.append("--ServerApp.open_browser=False")
    if os.geteuid() == 0:  # containers often run as root; Jupyter refuses that without being told
        command.append("--allow-root")
    return command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="training-at-scale", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    for name, help_text in (("lab", "copy the lessons if needed and open JupyterLab on the start page"),
                            ("copy", "only copy the lessons into the folder")):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"course folder (default: {DEFAULT_DIR})")
        if name == "lab":
            cmd.add_argument("--port", type=int, help="port for JupyterLab (default: the first free one from 8888)")
            cmd.add_argument("--no-browser", action="store_true", help="do not open a browser window")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "lab")  # `training-at-scale` alone opens the lab
    args = parser.parse_args(argv)
    target = args.dir.expanduser().resolve()
    _report(target, *copy_lessons(target))
    if args.command == "copy":
        return 0
    command = lab_command(target, args.port, not args.no_browser)
    os.execv(command[0], command)  # JupyterLab replaces this process: Ctrl-C stops it as usual


if __name__ == "__main__":
    sys.exit(main())
