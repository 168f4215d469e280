"""Start Nanoscope headless, let it answer one question with the bundled demo model, check the result.

    .venv/bin/python packaging/smoke_test.py                          # the source tree (python -m desktop)
    .venv/bin/python packaging/smoke_test.py dist/nanoscope/nanoscope # a frozen build

The app runs with ``QT_QPA_PLATFORM=offscreen``, a throw-away ``--home`` and ``--smoke-test``:
it loads the demo checkpoint, asks "What is 12 times 7?" and prints ``SMOKE OK <reply>`` (exit 0)
or ``SMOKE FAIL <reason>`` (exit 1). This script passes only if the exit code is 0, the last
output line is ``SMOKE OK`` with "84" in it, and stderr holds nothing but known-harmless lines:
an unexpected warning in a frozen build usually means a missing module, plugin or data file.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = "84"  # 12 times 7
DEFAULT_TIMEOUT_S = 300  # a cold frozen start loads ~1 GB of torch from disk

# stderr lines that are not a problem. Anything else fails the test, so keep these narrow.
HARMLESS_STDERR = [
    re.compile(p)
    for p in (
        r"^smoke test: loading ",  # the app's own progress line
        r"^This plugin does not support propagateSizeHints\(\)$",  # offscreen platform plugin
        r"^QStandardPaths: (XDG_RUNTIME_DIR not set|runtime directory .* permissions|wrong permissions)",
        r"^qt\.qpa\.fonts: Populating font family aliases took",
        r"^\s+warnings\.warn\(",  # source line under a warning that matched on its own line
    )
]


@dataclass
class SmokeResult:
    returncode: int
    stdout: str
    stderr: str

    def problems(self) -> list[str]:
        """Everything wrong with this run, as readable lines; empty when it passed."""
        found = []
        if self.returncode != 0:
            found.append(f"exit code {self.returncode}, expected 0")
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        if not last.startswith("SMOKE OK"):
            found.append(f"last output line is {last!r}, expected 'SMOKE OK ...'")
        elif EXPECTED not in last:
            found.append(f"reply does not contain {EXPECTED!r}: {last!r}")
        found += [
            f"unexpected stderr: {line}"
            for line in self.stderr.splitlines()
            if line.strip() and not any(p.search(line) for p in HARMLESS_STDERR)
        ]
        return found


def smoke_command(executable: Path | None, home: Path) -> list[str]:
    """The frozen executable, or ``python -m desktop`` from this checkout when none is given."""
    base = [str(executable)] if executable is not None else [sys.executable, "-m", "desktop"]
    return [*base, "--home", str(home), "--smoke-test"]


def run_smoke(executable: Path | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> SmokeResult:
    """Run the app once in smoke-test mode and capture what it printed."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONUNBUFFERED="1")
    env.pop("NANOSCOPE_HOME", None)  # --home decides; never touch the user's real files
    with tempfile.TemporaryDirectory(prefix="nanoscope-smoke-") as home:
        try:
            proc = subprocess.run(
                smoke_command(executable, Path(home)),
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
            return SmokeResult(124, (out or "") + f"\nSMOKE FAIL no answer within {timeout:.0f} s", err or "")
    return SmokeResult(proc.returncode, proc.stdout, proc.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Smoke-test Nanoscope (frozen or from source).")
    parser.add_argument(
        "executable", nargs="?", type=Path, default=None, help="frozen app (default: python -m desktop)"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before giving up")
    args = parser.parse_args(argv)
    if args.executable is not None and not args.executable.is_file():
        print(f"smoke_test: no executable at {args.executable}", file=sys.stderr)
        return 2
    result = run_smoke(args.executable, args.timeout)
    problems = result.problems()
    if problems:
        print("--- stdout ---\n" + result.stdout + "--- stderr ---\n" + result.stderr, file=sys.stderr)
        for problem in problems:
            print(f"smoke_test: FAIL: {problem}", file=sys.stderr)
        return 1
    print(f"smoke_test: PASS ({result.stdout.strip().splitlines()[-1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
