"""Dependency direction, as Kafka's import-control: no one depends on the server."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "src" / "kbroker"

RULES = {
    # package: prefixes it must not import
    "_core": ("kbroker.",),
    "log": ("kbroker.network", "kbroker.server", "kbroker.protocol", "kbroker.client", "kbroker.coordinator"),
    "protocol": ("kbroker.network", "kbroker.server", "kbroker.log", "kbroker.client", "socket", "selectors"),
    "network": ("kbroker.server", "kbroker.log", "kbroker.client"),
    "security": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.client", "socket", "selectors"),
    "records": ("kbroker.server", "kbroker.network", "kbroker.log"),
    "quota": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.client"),
    "analysis": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.client"),
    # pure state machines a deterministic simulation drives: no I/O, threads or clocks
    "metadata": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.client", "kbroker.raft",
                 "socket", "selectors", "threading", "time"),
    "controller": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.client", "kbroker.raft",
                   "socket", "selectors", "threading", "time"),
    "raft": ("kbroker.server", "kbroker.network", "kbroker.client", "kbroker.controller", "kbroker.cluster",
             "socket", "selectors", "threading"),
    # MirrorMaker 2 is a client application: it talks to clusters only through kbroker.client
    "mirror": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.coordinator", "kbroker.raft",
               "kbroker.controller", "kbroker.cluster"),
    # replication's state machines act on a partition's Log (its offsets, epochs and errors,
    # as raft's do on the metadata log) but own no server, network, threads or clocks
    "cluster": ("kbroker.server", "kbroker.network", "kbroker.client", "kbroker.raft",
                "kbroker.controller", "socket", "selectors", "threading", "time"),
}


def _imports(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_layering():
    bad = []
    for pkg, forbidden in RULES.items():
        for f in (ROOT / pkg).rglob("*.py"):
            for name in _imports(f):
                if any(name == p.rstrip(".") or name.startswith(p if p.endswith(".") else p + ".") or name == p
                       for p in forbidden):
                    if pkg == "_core" and name.startswith("kbroker._core"):
                        continue
                    bad.append(f"{f.relative_to(ROOT.parent)} imports {name}")
        for f in (ROOT / pkg).rglob("*.pyx"):
            text = f.read_text()
            for p in forbidden:
                for line in text.splitlines():
                    s = line.strip()
                    if s.startswith(("import ", "from ", "cimport ")) and p in s and not (
                            pkg == "_core" and "kbroker._core" in s):
                        bad.append(f"{f.relative_to(ROOT.parent)}: {s}")
    assert not bad, "\n".join(bad)


def test_repository_root_never_shadows_the_installed_package():
    """src layout: from the repository root (where users run ``python -m bench.produce`` and
    where Spark starts its Python workers) ``import kbroker`` must find the installed package
    (or the editable src/ tree), never an uncompiled copy beside bench/."""
    import subprocess
    import sys
    repo = ROOT.parent.parent
    assert not (repo / "kbroker").exists()
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import kbroker.kernels as k, kbroker; "
                        "k.load('log_scan'); print(kbroker.__file__)"],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert pathlib.Path(r.stdout.strip()).parent != repo / "kbroker"


def test_a_missing_kernel_says_how_to_build_it():
    import pytest
    from kbroker import kernels
    if kernels.NO_EXTENSIONS or kernels.ALLOW_FALLBACK:
        return   # the twins were asked for: nothing is missing
    with pytest.raises(ImportError, match=r"pip install -e \.") as ei:
        kernels.load("no_such_kernel")
    assert "KBROKER_NO_EXTENSIONS=1" in str(ei.value)
