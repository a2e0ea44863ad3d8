"""Re-run the README's `$ memplan ...` examples and report the numbers that went stale.

The README shows real output; a change to the estimator moves numbers in blocks that nothing
re-runs, and sessions 17-18 found several blocks one to ten sessions old. This re-runs each
example (estimate, plan, size, export, models, nodes, gpus, --version) in a scratch directory,
in README order, after writing the files the README shows with `$ cat FILE`, and lists every
number of the README's output (a token like 14.08, 3,116, 33.7%) that the real output does not
contain. Text is not compared (tables wrap with the terminal's width), only numbers, and the
seconds a search took are skipped. Exit status 1 when a number is stale, 0 otherwise.

    PYTHONPATH=src python scripts/readme_examples.py [--only REGEX] [--quick]

`--quick`: only the examples that take about a second (`--quiet` verdicts, errors, exports,
listings), as `tests/test_readme_examples.py` runs in CI; the full set takes about ten minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
RUNNABLE = ("estimate", "plan", "size", "export", "models", "nodes", "gpus", "--version")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?%?")
SEARCH_SECONDS = re.compile(r"(evaluated in |Probed GPUs: [^.]*\. )[\d.]+ s")


@dataclass(frozen=True)
class Example:
    line: int
    """1-based README line of the command."""
    command: str
    output: str
    files: tuple[tuple[str, str], ...]
    """(name, content) of the `$ cat` blocks above it, to write before running."""

    @property
    def inputs(self) -> list[str]:
        """Files the command reads: the values of ``--recipe``, ``--from``, ``--hardware`` and
        ``--against``, and a positional model given as a ``.json`` config."""
        words = shlex.split(self.command)
        named = [b for a, b in zip(words, words[1:])
                 if a in ("--recipe", "--from", "--hardware", "--against")]
        return named + [w for w in words[2:3] if w.endswith(".json")]

    @property
    def quick(self) -> bool:
        """About a second, and its inputs shown in the README (not made by a slower example)."""
        words = self.command.split()
        shown = {name for name, _ in self.files}
        return (("--quiet" in words or words[1] in ("export", "models", "nodes", "gpus",
                                                    "--version") or "Error" in self.output)
                and all(f in shown for f in self.inputs))


def examples(text: str) -> list[Example]:
    """Every runnable `$ memplan` command of ``text`` with the output lines under it (up to the
    next `$ ` line or the closing fence)."""
    lines = text.split("\n")
    files: list[tuple[str, str]] = []
    out: list[Example] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            i += 1
            continue
        cmd, j = line[2:].split("  #")[0].rstrip(), i + 1
        while cmd.endswith("\\"):
            cmd, j = cmd[:-1].rstrip() + " " + lines[j].strip(), j + 1
        k = j
        while k < len(lines) and not lines[k].startswith(("```", "$ ")):
            k += 1
        body = "\n".join(lines[j:k])
        words = cmd.split()
        if words[0] == "cat" and len(words) == 2:
            files.append((words[1], body + "\n"))
        elif (words[0] == "memplan" and len(words) > 1 and words[1] in RUNNABLE
              and not set(cmd) & set("<>|;&")):
            out.append(Example(i + 1, cmd, body, tuple(files)))
        i = k
    return out


def stale_numbers(example: Example, got: str) -> list[str]:
    """Numbers of the README's output that ``got`` lacks (whitespace ignored)."""
    seen = set(NUMBER.findall(re.sub(r"\s+", " ", SEARCH_SECONDS.sub("", got))))
    want = NUMBER.findall(SEARCH_SECONDS.sub("", example.output))
    return [n for n in want if n not in seen and len(n.strip("-%").replace(",", "")) > 1]


def run(example: Example, workdir: Path) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "200"}
    src = str(README.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "memplan", *shlex.split(example.command)[1:]],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def check(selected: list[Example]) -> list[tuple[Example, list[str] | None]]:
    """(example, its stale numbers) for each example, run in README order in one scratch
    directory (a plan's ``--save-best`` file is there for the export after it); None for an
    example whose input file neither the README shows nor an earlier example wrote."""
    out: list[tuple[Example, list[str] | None]] = []
    with tempfile.TemporaryDirectory() as d:
        for ex in selected:
            for name, content in ex.files:
                (Path(d) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(d) / name).write_text(content)
            if not all((Path(d) / f).exists() for f in ex.inputs):
                out.append((ex, None))
                continue
            out.append((ex, stale_numbers(ex, run(ex, Path(d))[1])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="regex the command must match")
    ap.add_argument("--quick", action="store_true", help="only the examples that take a second")
    args = ap.parse_args()
    chosen = [ex for ex in examples(README.read_text())
              if (not args.only or re.search(args.only, ex.command))
              and (ex.quick or not args.quick)]
    bad = skipped = 0
    for ex, stale in check(chosen):
        print(f"README:{ex.line}: {ex.command[:100]}")
        if stale is None:
            print(f"  not run: its input ({', '.join(ex.inputs)}) is not in the README")
        else:
            print(f"  stale: {', '.join(stale)}" if stale else "  current", flush=True)
        bad += bool(stale)
        skipped += stale is None
    print(f"{len(chosen)} examples, {bad} with stale numbers, {skipped} not run")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
