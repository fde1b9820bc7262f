# syntax=docker/dockerfile:1
# The service image (default target, last stage) and the compaction image (--target compaction: adds a JRE, pyspark
# and Spark's Kafka connector).
#
#   docker build -t eos-pipeline .                                   entrypoint `pipeline`
#   docker run --rm eos-pipeline run pipeline.examples.running_totals:app --bootstrap-servers broker:9092
#   docker build --target compaction -t eos-pipeline-compaction .    runs `snapshots compact ...`
#
# Settings come from PIPELINE_* environment variables (pipeline/settings.py); nothing is baked into the image.

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 pipeline \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/pipeline --shell /usr/sbin/nologin pipeline
WORKDIR /src
# Only what `pip install .` needs (pyproject's readme is README.md); everything else is in .dockerignore.
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY snapshots ./snapshots

# Spark's Kafka connector, resolved from Maven Central with the project's own pom and pinned versions.
FROM maven:3.9-eclipse-temurin-17 AS spark-jars
WORKDIR /build
COPY deploy/versions.env deploy/local/spark/pom.xml ./
RUN set -a && . ./versions.env && set +a \
 && mvn -q -B -f pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/opt/spark-kafka \
      -Dspark.version="$SPARK_VERSION" -Dscala.binary.version="$SCALA_BINARY_VERSION"

FROM base AS compaction
# Debian's default JRE of the base image's release (Spark 4 runs on 17 and 21).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
# hadolint ignore=DL3013
RUN pip install ".[spark]" && rm -rf /src
COPY --from=spark-jars /opt/spark-kafka /opt/spark-kafka
# snapshots/spark_session.py passes this to spark.jars, which accepts globs.
ENV SPARK_KAFKA_JARS=/opt/spark-kafka/*.jar
USER 10001:10001
WORKDIR /home/pipeline
CMD ["snapshots", "--help"]

FROM base AS runtime
# The package pins its dependencies in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install . && rm -rf /src
USER 10001:10001
WORKDIR /home/pipeline
# METRICS_PORT used by docker-compose.yml and deploy/kubernetes (/metrics, /ready, /live); the default 0 serves none.
EXPOSE 9464
# Exec form: `pipeline` is PID 1 and receives SIGTERM itself (the runner commits open transactions, then leaves).
ENTRYPOINT ["pipeline"]
CMD ["--help"]
