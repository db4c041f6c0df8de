"""`bertscope probe <name>`: the word-level probes of Clark et al. (2019) sections 4-6.

Each probe is one module here with `HELP`, `DESCRIPTION`, `add_arguments(parser)` and
`run(args, probe_run)`; the metrics themselves live in `bertscope.analyses.<name>` and see
only arrays (word maps, argmaxes, JS sums), never the engine. `common.ProbeRun` owns what
every probe shares: the model, the run directory, CSV/PNG outputs and run.json.
"""
PROBES = {
    "syntax": "bertscope.probes.syntax",
    "coref": "bertscope.probes.coref",
    "classifier": "bertscope.probes.classifier",
    "cluster": "bertscope.probes.cluster",
}
