# One image for every Shunter service: web (ASGI), Celery worker and beat, and the engine.
# The engine service runs it on a GPU host (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SHUNTER_VAR_DIR=/var/lib/shunter

WORKDIR /app
# The benchmark runs' CSV folder exists (owned by shunter) before a volume is mounted
# on it, so the volume starts writable by the services' user.
RUN useradd --system --uid 10001 --home-dir /app shunter \
    && mkdir -p /var/lib/shunter/benchmarks && chown -R shunter /var/lib/shunter

COPY pyproject.toml README.md ./
# Every package folder of pyproject.toml's package-dir (tests/project/test_compose.py).
COPY project project
COPY common common
COPY platform platform
COPY tenants tenants
COPY benchmarks benchmarks
COPY console console
COPY gateway gateway
COPY engine engine
COPY kernels kernels
COPY migrations migrations
# TORCH_SPEC picks the build: the default CUDA wheel for GPU hosts; EXTRAS "gpu" adds
# Triton for the engine's kernels (EXTRAS="" for a control-plane-only image).
ARG TORCH_SPEC="torch>=2.4"
ARG EXTRAS="gpu"
RUN pip install "$TORCH_SPEC" && pip install ".[${EXTRAS}]"

# Static files are collected at build time and served by WhiteNoise.
RUN SECRET_KEY=build-only-collectstatic SHUNTER_STATIC_MANIFEST=1 \
    shunter manage collectstatic --noinput

USER shunter
EXPOSE 8000
CMD ["shunter", "web", "--host", "0.0.0.0", "--port", "8000"]
