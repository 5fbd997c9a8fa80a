"""The developers' benchmarks, run as ``asrpool bench TARGET`` once the harness is
installed (``asrpool.bench.cli`` lists them from :data:`BENCHMARKS`). Each writes JSON
to ``bench/results/`` of the checkout."""

BENCHMARKS = ("engine", "isolation", "queue", "soak", "padding", "hostwork", "parity", "gil",
              "nocuts", "failover")
