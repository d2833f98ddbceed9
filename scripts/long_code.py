"""Modules over ~400 lines and functions whose body is over ~80 lines (the signature, long
in a command's option declarations, is not counted): the places to split along the line a
reader would guess (STYLE.md). A function whose first body line is a comment starting
`# long:`, or a module with such a line among its first 40, says why it stays long and is
listed apart. `make check` runs it with --strict.

    .venv/bin/python scripts/long_code.py [--strict]   # --strict: exit 1 if any is found
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES, FUNCTION_LINES = 400, 80


def findings() -> tuple[list[str], list[str]]:
    long, excused = [], []
    for path in sorted([*ROOT.glob("nmt/*.py"), *ROOT.glob("scripts/**/*.py")]):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        n = text.count("\n")
        lines = text.splitlines()
        if n > MODULE_LINES:
            said = any(line.startswith("# long:") for line in lines[:40])
            (excused if said else long).append(f"{rel}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.body[0].lineno + 1
                if size <= FUNCTION_LINES:
                    continue
                where = f"{rel}:{node.lineno} {node.name}: {size} lines"
                first = node.body[0].lineno - 1
                said = any(
                    line.strip().startswith("# long:") for line in lines[first - 1 : first + 3]
                )
                (excused if said else long).append(where)
    return long, excused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args()
    long, excused = findings()
    for line in long:
        print(line)
    for line in excused:
        print(f"{line} (says why)")
    if args.strict and long:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
