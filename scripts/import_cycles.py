"""List the import cycles among clustersim's modules (CI prints them; tests/test_layout.py
checks the count).

Imports under `if TYPE_CHECKING:` are left out by default: an annotation may need a module
that imports this one, and that is no cycle at run time. With --all they count too (none
in cluster/, whose collaborators see the timeline through clustersim.cluster.ports).

    python scripts/import_cycles.py [--all]
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def import_cycles(package: str = "clustersim", type_checking: bool = False) -> list[list[str]]:
    """The strongly connected groups of more than one module (each sorted), largest first."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=not type_checking,
                              cache_dir=None)
    modules = sorted(graph.modules)
    # A module importing a package it is inside is no cycle: Python runs the package's
    # __init__ before any module in it (`clustersim.cli.app` calling `clustersim.cli.main`).
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m)
                       if not m.startswith(i + ".")) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return sorted(groups, key=lambda g: (-len(g), g))


def main(argv: list[str]) -> int:
    cycles = import_cycles(type_checking="--all" in argv)
    for group in cycles:
        print(f"{len(group)} modules: " + ", ".join(group))
    print(f"{len(cycles)} import cycle(s)" + (" (TYPE_CHECKING imports included)"
                                             if "--all" in argv else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
