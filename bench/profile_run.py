"""Where a whole `bertscope` command's time goes: the command under torch.profiler (CPU).

    python bench/profile_run.py OUT.txt run --corpus FILE --limit all --max-len 512 --quiet --threads 1 --out DIR

Runs the command in this process (`bertscope.cli.main.main`) inside `torch.profiler.profile`, with
four labelled ranges: the model forward of each batch, the attention function's statistics call
(`attention_stats`: the chunked kernel's matmuls and its compiled row pass), `HeadStats.add` and
the batch's collate. Writes to OUT.txt the wall time and the load average at the start and the end,
torch's op table (by self time) and the total time inside each label. The profiler's overhead
falls mostly on small ops, so it inflates the kernel's share: read the shares against
`bench_surface.py --profile`, which times one batch without it.
"""
from __future__ import annotations

import functools
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def label(owner, name: str, tag: str):
    """Wrap owner.name in a torch.profiler range called `tag`."""
    from torch.profiler import record_function

    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with record_function(tag):
            return fn(*args, **kwargs)
    setattr(owner, name, wrapped)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, command = argv[0], argv[1:]
    import torch
    from torch.profiler import ProfilerActivity, profile

    import bertscope.engine.accumulate as accumulate
    import bertscope.engine.loop as loop
    import bertscope.models.attention as attention
    from bertscope.cli.main import run_command

    label(attention, "attention_stats", "## attention_stats (chunked kernel)")
    label(loop, "_collate", "## collate")
    label(loop, "forward", "## model forward")
    label(accumulate.HeadStats, "add", "## HeadStats.add")
    from bertscope.cli.main import build_parser

    args = build_parser(command).parse_args(command)
    load_start = open("/proc/loadavg").read().strip()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        code = run_command(args)
    wall = time.perf_counter() - t0
    table = prof.key_averages()
    with open(out, "w") as f:
        f.write(f"bertscope {' '.join(command)}\nwall {wall:.1f} s (model load included), exit {code}, "
                f"torch threads {torch.get_num_threads()}; /proc/loadavg at the start {load_start}, at the end "
                f"{open('/proc/loadavg').read().strip()}\n\n")
        f.write(table.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
        f.write("\n\nlabelled ranges:\n")
        for event in table:
            if event.key.startswith("##"):
                f.write(f"{event.key}: {event.cpu_time_total / 1e6:.2f} s in {event.count} calls\n")
    print(f"wrote {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
