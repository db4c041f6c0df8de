"""No import cycles: every bertscope module can be the first one a program imports.

A cycle between two modules (say probes/ importing cli, which imports probes/) only breaks
when one particular module is imported first, so each module is imported first once, in a
child interpreter, after dropping every bertscope module loaded before it (torch,
transformers and triton stay loaded: they are not ours and cost seconds each).
"""
import os
import subprocess
import sys

CHILD = r"""
import importlib, pkgutil, sys
import bertscope, bertscope.kernels, bertscope.analyses

names = set()
for package in (bertscope, bertscope.kernels, bertscope.analyses):
    names |= {m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")}
names = {n for n in names if not n.endswith(".__main__")}  # running one is running the program
failed = []
for name in sorted(names):
    for loaded in [m for m in sys.modules if m == "bertscope" or m.startswith("bertscope.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as error:  # noqa: BLE001 - report every module that cannot come first
        failed.append(f"{name}: {type(error).__name__}: {error}")
print(len(names))
print("\n".join(failed))
"""


def test_every_module_imports_first():
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    count, *failed = done.stdout.strip().split("\n")
    assert int(count) >= 40, done.stdout  # every module was found, not an empty walk
    assert not [line for line in failed if line], "\n".join(failed)


def imported_modules(module) -> set[str]:
    """Every bertscope module `module`'s source imports, at its top or inside a function."""
    import ast
    import importlib

    path = importlib.import_module(module).__file__
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                base = package + ("." + base if base else "")
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("bertscope")}


def test_no_lazy_import_cycles_the_review_found():
    """Cycles dodged by a function-level import are still cycles (tests/test_import_graph.py
    finds any): the Triton map and JS kernels do not import each other, and the fast paths do
    not lean on the oracle."""
    assert not {"bertscope.kernels.triton_js"} & imported_modules("bertscope.kernels.triton_maps")
    assert not {"bertscope.kernels.triton_maps"} & imported_modules("bertscope.kernels.triton_js")
    assert "bertscope.kernels.eager" not in imported_modules("bertscope.kernels.chunked")
    assert "bertscope.kernels.eager" not in imported_modules("bertscope.kernels.triton_attention")


def test_a_run_imports_no_plotting_or_table_library():
    """`bertscope run` draws its figures in helper processes and writes Parquet only with
    --per-example: its own process imports neither matplotlib nor pyarrow (nor pandas, sklearn)."""
    code = ("import sys, bertscope.cli.main, bertscope.analyses.surface.command; bertscope.cli.main.build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'pyarrow', 'pandas', 'sklearn'}))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
