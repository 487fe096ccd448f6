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
    "records": ("kbroker.server", "kbroker.network", "kbroker.log"),
    "analysis": ("kbroker.server", "kbroker.network", "kbroker.log", "kbroker.client"),
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
