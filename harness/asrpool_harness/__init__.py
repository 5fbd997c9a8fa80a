"""asrpool's developers' harness: the experiments behind the project's measurements
(``asrpool_harness.bench``), the local control plane and nodes the tests run pods on
(``asrpool_harness.localcluster``), and Redis servers for tests and benchmarks
(``asrpool_harness.redis_servers``). The test command installs it; the product's wheel
and images never carry it. It uses the product's public seams: an engine, an app
factory, the routers' and pods' processes, the Redis scripts' codecs."""
