"""Checks scripts/plot_bench.py without drawing (no matplotlib needed): the
raw-driver baselines it reads from the opencl-raw and cuda-raw tables, its
--log-y option, and that it explains bidirectional figures. Run by CTest
(cli.plot_bench_options)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_bench  # noqa: E402

tables = {
    "opencl_raw_bandwidth": {
        "title": "256 MiB copy from page-locked memory, GB/s: library vs raw OpenCL",
        "columns": ["copy", "raw blocking", "raw async+fin", "library"],
        "rows": [["H2D 256 MiB", 17.5, 17.3, 17.7], ["D2H 256 MiB", 15.0, 15.1, None]],
    },
    "cuda_raw_bandwidth": {
        "title": "256 MiB blocking copies, GB/s: driver vs mapping",
        "columns": ["copy", "driver GB/s", "mapping GB/s", "speed ratio"],
        "rows": [["H2D locked", 25.0, 24.0, 0.96], ["D2D", None, 1.0, None]],
    },
}
got = plot_bench.raw_baselines(tables)
want = [("raw OpenCL H2D 256 MiB, blocking", 17.5), ("raw OpenCL D2H 256 MiB, blocking", 15.0),
        ("CUDA driver H2D locked 256 MiB, blocking", 25.0)]
if got != want:
    sys.exit("raw_baselines: %r, want %r" % (got, want))
if plot_bench.raw_baselines({"bandwidth": {"columns": [], "rows": []}}):
    sys.exit("raw_baselines found a baseline in a report without the raw-driver sections")
doc = plot_bench.__doc__
if "--log-y" not in doc or "bytes of both" not in doc:
    sys.exit("the docstring (the --help text) does not explain --log-y and bidirectional figures")
source = open(plot_bench.__file__).read()
if 'add_argument("--log-y"' not in source or 'set_yscale("log")' not in source:
    sys.exit("plot_bench.py has no --log-y option")
print("plot_bench.py: raw-driver baselines %s; --log-y; bidirectional explained" % [g[1] for g in got])
