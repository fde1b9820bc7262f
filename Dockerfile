# syntax=docker/dockerfile:1
# The service image (default target, last stage) and the compaction image (--target compaction: adds a JRE, pyspark
# and Spark's Kafka connector).
#
#   docker build -t eos-pipeline .                                   entrypoint `pipeline`
#   docker run --rm eos-pipeline run pipeline.examples.running_totals:app --bootstrap-servers broker:9092
#   docker build --target compaction -t eos-pipeline-compaction .    runs `snapshots compact ...`
#
# BASE_IMAGE: any Debian bookworm-based image with python3 (3.11) and its venv module. The default comes from a
# registry; without one, `make image` builds a base from Debian's packages (deploy/image/base.sh) and passes
# --build-arg BASE_IMAGE=localhost/eos-pipeline-base:bookworm (podman). Nothing else is pulled: the JRE and Maven
# come from the base's apt sources, Python packages from its pip index (the versions and hashes of requirements/), the
# connector from Maven Central.
#
# Settings come from PIPELINE_* environment variables (pipeline/settings.py); nothing is baked into the image.

ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
# Marks every image and build stage of this project (deploy/image/build.sh prunes its own untagged ones by it).
LABEL org.opencontainers.image.title="eos-pipeline"
# A virtualenv: Debian's own python3 refuses system-wide pip installs (PEP 668); the slim image's python is fine
# with it, and the same layout everywhere keeps `pipeline`, `snapshots` and `spark-submit` on the PATH.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv \
 && groupadd --system --gid 10001 pipeline \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/pipeline --shell /usr/sbin/nologin pipeline

# Only what `pip install .` needs (pyproject's readme is README.md); everything else is in .dockerignore.
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY pipeline /src/pipeline
COPY snapshots /src/snapshots

FROM base AS jre
# Debian's default JRE of the base image's release (Spark 4 runs on 17 and 21).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

# Spark's Kafka connector, resolved from Maven Central with the project's own pom, for the Spark version of the
# pyspark the compaction lock installs (deploy/versions.env pins the rest; the pom pins the dependency plugin).
# Debian's Maven: no Maven image to pull.
FROM jre AS spark-jars
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY deploy/versions.env deploy/local/spark/pom.xml requirements/compaction.txt ./
RUN set -a && . ./versions.env && set +a \
 && SPARK_VERSION="$(sed -n 's/^pyspark==\([^ ;]*\).*/\1/p' compaction.txt)" && test -n "$SPARK_VERSION" \
 && mvn -q -B -f pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/opt/spark-kafka \
      -Dspark.version="$SPARK_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION" \
 && rm -rf /root/.m2

FROM jre AS compaction
# The dependencies in a layer of their own, the exact versions and hashes of the lock (`make lock`): a change to the
# code or the README reinstalls only the package, which then resolves nothing (--no-deps).
COPY requirements/compaction.txt /src/requirements.txt
RUN pip install --require-hashes -r /src/requirements.txt
COPY --from=spark-jars /opt/spark-kafka /opt/spark-kafka
# snapshots/spark_session.py passes this to spark.jars, which accepts globs.
ENV SPARK_KAFKA_JARS=/opt/spark-kafka/*.jar
# The code last: a change to it rebuilds only these two steps.
COPY --from=source /src /src
RUN pip install --no-deps /src && rm -rf /src
USER 10001:10001
WORKDIR /home/pipeline
CMD ["snapshots", "--help"]

FROM base AS runtime
COPY requirements/service.txt /src/requirements.txt
RUN pip install --require-hashes -r /src/requirements.txt
COPY --from=source /src /src
RUN pip install --no-deps /src && rm -rf /src
# STATE_STORE=disk keeps each partition's state here (RocksDB, the [disk] extra is in service.txt): mount a volume of
# its own per instance (docker-compose.yml, the StatefulSet's volumeClaimTemplates); one process per directory.
RUN mkdir -p /var/lib/pipeline/state && chown 10001:10001 /var/lib/pipeline/state
ENV PIPELINE_STATE_DIR=/var/lib/pipeline/state
USER 10001:10001
WORKDIR /home/pipeline
# METRICS_PORT used by docker-compose.yml and deploy/kubernetes (/metrics, /ready, /live); the default 0 serves none.
EXPOSE 9464
# Exec form: `pipeline` is PID 1 and receives SIGTERM itself (the runner commits open transactions, then leaves).
ENTRYPOINT ["pipeline"]
CMD ["--help"]
