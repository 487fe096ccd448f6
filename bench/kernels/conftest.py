"""pytest config for kernel benchmarks (pytest-benchmark).

Run:  python -m pytest bench/kernels/<file> --benchmark-only
      (add --benchmark-json=out.json to keep the numbers)

- Files named ``bench_*.py`` are collected here even though the project's
  python_files pattern is ``test_*.py`` (bench/ is not in testpaths).
- A benchmark marks its group's baseline with
  ``benchmark.extra_info["role"] = "reference"``; after the run the terminal
  summary prints every other benchmark of the group as a speed ratio
  (reference median / its median, so > 1 means faster than the reference).
"""
from __future__ import annotations

import pytest


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        if not parent.session.isinitpath(file_path):  # explicit paths are collected anyway
            return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    benches = [b for b in getattr(session, "benchmarks", []) or [] if b and not b.has_error]
    if not benches:
        return
    groups: dict[str, list] = {}
    for b in benches:
        groups.setdefault(b.group or "(no group)", []).append(b)
    tr = terminalreporter
    tr.section("kernel benchmark ratios (reference median / median)")
    for group, members in sorted(groups.items()):
        refs = [b for b in members if b.extra_info.get("role") == "reference"]
        if not refs:
            continue
        ref = refs[0]
        ref_median = ref.stats.median
        tr.write_line(f"{group}: reference {ref.name} median {ref_median * 1e6:.2f} us")
        for b in members:
            if b is ref:
                continue
            ratio = ref_median / b.stats.median
            tr.write_line(f"    {b.name:<60} median {b.stats.median * 1e6:10.2f} us   x{ratio:8.2f}")
