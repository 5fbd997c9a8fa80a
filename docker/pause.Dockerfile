# The kubelet's sandbox ("pause") image. Its one file is Kubernetes' own pause.c, which
# tools/images/build compiles statically from the k8s.io/kubernetes module in the Go
# module cache into the build context; nothing of Kubernetes is kept in this repository.
#   tools/images/build pause
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
