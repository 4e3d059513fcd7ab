"""What the demo prints while it runs: what is happening, in a line every half minute (the drain, each
sink's delivered count and lag), when something first happens (the drain streams, the first changes
reach the mirror), and Dagster's errors. Dagster's own output (a DEBUG line per event, the daemon's
ticks, Spark's start-up) goes to a log file the guide names, not to the console.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime
from pathlib import Path

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.config.errors import describe_error
from cdc_pipeline.defs.health import sink_figures, slot_figures

EVERY_SECONDS = 30.0
PROBLEM = re.compile(r" - (ERROR|CRITICAL) - | - (RUN_FAILURE|STEP_FAILURE) - ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def say(text: str) -> None:
    print(f"{datetime.now():%H:%M:%S}  {text}", flush=True)


def progress(config: PipelineConfig) -> str:
    slot = slot_figures(config)
    parts = [f"drain: {'streaming' if slot.get('slot_active') else 'not running'}, "
             f"slot lag {slot.get('slot_lag_seconds', 0.0):.1f} s"]
    for sink in config.sinks:
        f = sink_figures(config, sink)
        parts.append(f"{sink.name}: {f['delivered_total']:,} delivered, lag {f['lag_seconds']:.1f} s "
                     f"({f['lag_messages']:,} messages), {f.get('parked', 0)} parked")
    return " | ".join(parts)


def report(config: PipelineConfig, stop: threading.Event) -> None:
    """Milestones as they happen (checked every few seconds), the progress line every EVERY_SECONDS."""
    streaming = delivered = False
    due = time.monotonic() + EVERY_SECONDS
    while not stop.wait(3.0):
        try:
            if not streaming and slot_figures(config).get("slot_active"):
                streaming = True
                say("the drain run is streaming the slot into the change log")
            if not delivered and any(sink_figures(config, s)["delivered_total"] for s in config.sinks):
                delivered = True
                say("the first changes reached the mirror")
            if time.monotonic() >= due:
                due = time.monotonic() + EVERY_SECONDS
                say(progress(config))
        except Exception as exc:  # a figure we could not read this time; the demo goes on
            say(f"could not read the pipeline's figures: {describe_error(exc)}")


def forward_problems(log: Path, stop: threading.Event) -> None:
    """Dagster's errors (a failed run or step, an ERROR line) from its log file to the console."""
    with log.open("rb") as f:
        while not stop.is_set():
            line = f.readline()
            if not line:
                stop.wait(1.0)
                continue
            text = ANSI.sub("", line.decode(errors="replace")).rstrip()
            if PROBLEM.search(text):
                say(f"dagster: {text}")
