# One image for every ring broker (target "broker"), and the same plus Java
# and PySpark for the example Spark job (target "spark"). docker-compose.yml
# builds both; `docker build --target broker -t ring .` builds a broker alone.
FROM python:3.11-slim AS broker

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/ring
# Metadata first: the dependency layer is rebuilt only when the metadata changes.
COPY setup.cfg pyproject.toml README.md ./
COPY ring ./ring
COPY sparkio ./sparkio
RUN pip install .

# Brokers run unprivileged; their data lives on a volume mounted at /var/lib/ring.
RUN useradd --system --uid 10001 --home-dir /var/lib/ring ring \
    && mkdir -p /var/lib/ring \
    && chown ring:ring /var/lib/ring
USER ring
VOLUME ["/var/lib/ring"]
# 9250: client API; 9251: peer API (gossip, replication), authenticated by the cluster secret.
EXPOSE 9250 9251
ENTRYPOINT ["ring"]
CMD ["serve", "--listen", "0.0.0.0:9250", "--data-dir", "/var/lib/ring/data"]


FROM broker AS spark
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install ".[spark]"
COPY examples ./examples
ENV SPARK_LOCAL_IP=127.0.0.1 \
    PYSPARK_PYTHON=python
USER ring
ENTRYPOINT []
CMD ["python", "examples/clickstream_job.py", "--help"]
