# topoplace: kube-scheduler extender image.
#   docker build -t ghcr.io/topoplace/topoplace:0.1.0 .
#   docker run --rm -p 8888:8888 ghcr.io/topoplace/topoplace:0.1.0            # embedded demo cluster
#   docker run --rm -v ~/.kube:/kube:ro ghcr.io/topoplace/topoplace:0.1.0 serve --host 0.0.0.0 --kubeconfig /kube/config
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
COPY topology ./topology
COPY benchmarks ./benchmarks
COPY config ./config
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="topoplace" \
      org.opencontainers.image.description="Topology- and health-aware kube-scheduler extender for GPU workloads" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /install /usr/local
RUN useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin topoplace
USER 65532:65532
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
EXPOSE 8888 8889
# The health listener (--health-port) is plain HTTP even when the verbs need a client
# certificate, so the check works with or without mTLS.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8889/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["topoplace"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8888", "--health-host", "0.0.0.0", "--health-port", "8889"]
