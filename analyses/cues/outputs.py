"""What `bertscope cues` writes: one row per (data, split, cue) and the coverage against
productivity figure; the names the command and the report section share."""
from __future__ import annotations

CUES_FILE = "cues.csv"  # one row per (data, split, cue) applicable at least --min-n times
CUES_FIGURE = "cues.png"
