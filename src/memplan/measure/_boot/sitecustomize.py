"""Loaded by Python at start-up when ``memplan measure`` put this folder on PYTHONPATH."""

import os
import sys

if os.environ.get("MEMPLAN_MEASURE_OUT"):
    try:
        from memplan.measure.autostart import start_from_env

        start_from_env()
    except Exception as e:  # noqa: BLE001 - the user's program must run regardless
        sys.stderr.write(f"memplan measure: not measuring this process: {e}\n")
