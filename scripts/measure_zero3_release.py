"""Which thread frees DeepSpeed ZeRO-3's released buffers (estimate/zero3_live.py rule 6).

Runs one case of ``dist_cases.toml`` (default ``deepspeed zero3 bf16 ckpt reuse 0``) under
``torchrun`` on gloo/CPU with ``memplan.validate.dist_worker``, and records, for every storage
of ``--bytes`` (default 262,144 B: the tiny Llama's bf16 embedding and head) allocated in a
step: the moment it was allocated and freed, whether the thread that dropped the last reference
was the main thread, and the last frames of its allocating stack. A free off the main thread
means the collective's work object (held by a gloo worker thread) outlived DeepSpeed's release.
Writes ``validation/zero3_release.json`` with each rank's step peaks.

Usage: ``PYTHONPATH=src python scripts/measure_zero3_release.py [--nproc 4] [--steps 6]
[--pin 0]`` (``--pin``: taskset the launch onto those CPUs, to make the threads compete).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = "deepspeed zero3 bf16 ckpt reuse 0"


def _worker(size: int) -> None:
    import memplan.runtime.tracker as T
    import memplan.validate.dist_worker as W

    main_id, frees, where = threading.main_thread().ident, [], {}

    def label(tr: T.StorageTracker) -> str | None:
        w = tr.window
        return w.segments[-1].label if w is not None and w.segments else None

    alloc, fin = T.StorageTracker._alloc, T.StorageTracker._on_finalize

    def _alloc(self, sid, rec):  # type: ignore[no-untyped-def]
        out = alloc(self, sid, rec)
        if rec.nbytes == size and self.window is not None:
            stack = [f"{Path(f.filename).name}:{f.name}" for f in traceback.extract_stack()
                     if "memplan" not in f.filename and f.filename != __file__][-4:]
            where[self._next_uid - 1] = (self.window.step, label(self), stack)
        return out

    def _on_finalize(self, sid, ref):  # type: ignore[no-untyped-def]
        uid = self._uid_of.get(sid)
        if uid in where:
            step, at, stack = where.pop(uid)
            frees.append({"step": step, "allocated_in": at, "freed_in": label(self),
                          "freed_off_main_thread": threading.get_ident() != main_id,
                          "allocated_by": stack})
        return fin(self, sid, ref)

    T.StorageTracker._alloc, T.StorageTracker._on_finalize = _alloc, _on_finalize
    run_case = W.run_case

    def traced(case, rank):  # type: ignore[no-untyped-def]
        out = run_case(case, rank)
        out["frees"] = list(frees)
        return out

    W.run_case = traced
    W.main(sys.argv[sys.argv.index("--plan"):])


def main() -> None:
    if "--worker" in sys.argv:
        return _worker(int(sys.argv[sys.argv.index("--worker") + 1]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--case", default=CASE)
    ap.add_argument("--bytes", type=int, default=262_144)
    ap.add_argument("--pin", default="", help="taskset CPU list for the launch")
    a = ap.parse_args()
    from memplan.export import export
    from memplan.validate.distributed import _free_port, dist_cases

    case = next(c for c in dist_cases(nproc=a.nproc) if c.name == a.case)
    with tempfile.TemporaryDirectory(prefix="memplan-z3rel-") as tmp:
        work = Path(tmp)
        (work / "case.json").write_text(export(case.recipe, case.target).text)
        plan = [{"name": case.name, "model": case.model, "recipe": case.recipe.to_dict(),
                 "config": str(work / "case.json"), "out": str(work / "case"),
                 "steps": a.steps}]
        (work / "plan.json").write_text(json.dumps(plan))
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        cmd = (["taskset", "-c", a.pin] if a.pin else []) + [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={a.nproc}",
            f"--master-port={_free_port()}", str(Path(__file__).resolve()), "--worker",
            str(a.bytes), "--plan", str(work / "plan.json")]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if p.returncode:
            raise SystemExit((p.stdout + p.stderr)[-3000:])
        ranks = [json.loads((work / f"case.rank{r}.json").read_text()) for r in range(a.nproc)]
    out = {"command": "PYTHONPATH=src python scripts/measure_zero3_release.py "
                      f"--nproc {a.nproc} --steps {a.steps}" + (f" --pin {a.pin}" if a.pin else ""),
           "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "case": case.name,
           "bytes": a.bytes, "ranks": [
               {"rank": d["rank"], "step_peaks": [s["peak_bytes"] for s in d["steps"]],
                "forward_peaks": [s["phase_peaks"]["forward"] for s in d["steps"]],
                "frees": d["frees"]} for d in ranks]}
    path = ROOT / "validation" / "zero3_release.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for r in out["ranks"]:
        off = [f for f in r["frees"] if f["freed_off_main_thread"]]
        print(f"rank {r['rank']}: peaks {r['step_peaks']}; {len(r['frees'])} frees of "
              f"{a.bytes:,} B, {len(off)} off the main thread: "
              + "; ".join(f"step {f['step']} {f['allocated_by'][1]} {f['allocated_in']} -> "
                          f"{f['freed_in']}" for f in off))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
