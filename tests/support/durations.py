"""The slowest tests of a run, printed as its last lines (:class:`Durations`, registered by
tests/conftest.py), and a run's profile per module from its JUnit XML (``python -m
tests.support.durations report.xml``: what tests/README.md's profile table is made with).

A test's time here is its setup, call and teardown together: a module- or session-scoped
fixture's setup is counted in the first test that uses it (per xdist worker), which is where a
costly fixture shows."""
from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET

#: How many tests the end of a run names.
SHOWN = 20


class Durations:
    """A pytest plugin: sums each test's phases as their reports arrive (from the xdist workers too)
    and prints the :data:`SHOWN` slowest after everything else, the final summary line included."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_unconfigure(self, config) -> None:
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None or not self.seconds:
            return
        terminal.write_sep("=", f"slowest {min(SHOWN, len(self.seconds))} tests (setup + call + teardown)")
        for nodeid, s in self.seconds.most_common(SHOWN):
            terminal.write_line(f"{s:8.2f}s {nodeid}")


def profile(junit_xml: str, modules: int = 40) -> str:
    """Per module: seconds (setup + call + teardown, summed over its tests) and tests, slowest first."""
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        module = "/".join(parts[:next((i + 1 for i, p in enumerate(parts) if p.startswith("test_")), len(parts))]) + ".py"
        seconds[module] += float(case.get("time") or 0)
        count[module] += 1
    lines = [f"all: {sum(seconds.values()):.0f} s in {sum(count.values())} tests", "",
             "| module | s | tests |", "|---|---:|---:|"]
    lines += [f"| {m} | {s:.1f} | {count[m]} |" for m, s in seconds.most_common(modules)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A run's seconds per module, from pytest's --junitxml report.")
    parser.add_argument("junit_xml")
    parser.add_argument("--modules", type=int, default=40, help="how many modules to list (default 40)")
    args = parser.parse_args(argv)
    print(profile(args.junit_xml, args.modules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
