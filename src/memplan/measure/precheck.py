"""``memplan measure``'s inputs, checked before anything runs (issue #15): a bad ``--against``
file, an unwritable ``--out`` or a command that does not exist must not cost a whole run."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MemplanError

MAX_INTERVAL_S = 60.0


def check_measure_inputs(cmd: list[str], out: Path, against: Path | None,
                         interval_s: float) -> Any:
    """Raise one ``ConfigError`` listing every bad input; return the parsed ``--against``
    breakdown (or None) so it is read once."""
    problems: list[str] = []
    if not (isinstance(interval_s, (int, float)) and math.isfinite(interval_s)
            and 0 < interval_s <= MAX_INTERVAL_S):
        problems.append(f"--interval={interval_s!r} must be a number of seconds above 0 and at "
                        f"most {MAX_INTERVAL_S:g} (the default is 0.01).")
    if cmd and shutil.which(cmd[0]) is None:
        problems.append(f"command {cmd[0]!r} is not an executable file nor on PATH. Fix: check "
                        "the spelling, or give its full path (e.g. `-- python train.py`).")
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        problems.append(f"--out {str(out)!r} cannot be created or written ({e.strerror or e}). "
                        "Fix: pass a folder you can write, e.g. --out ./memplan-measure.")
    expected = None
    if against is not None:
        from ..breakdown import Breakdown
        from .cli_run import read_json

        try:
            expected = Breakdown.from_dict(read_json(against))
        except MemplanError as e:
            problems.append(f"--against: {e}")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            problems.append(f"--against {str(against)!r} is JSON but not a memplan estimate/trace "
                            f"report ({type(e).__name__}: {e}). Fix: pass the output of "
                            "`memplan estimate ... --format json`.")
    if problems:
        raise ConfigError(problems)
    return expected
