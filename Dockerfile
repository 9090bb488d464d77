# One image for every Shunter service: web (ASGI), Celery worker and beat, and the engine.
# The engine service runs it on a GPU host (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SHUNTER_VAR_DIR=/var/lib/shunter

WORKDIR /app
RUN useradd --system --uid 10001 --home-dir /app shunter \
    && mkdir -p /var/lib/shunter && chown shunter /var/lib/shunter

COPY pyproject.toml README.md ./
COPY platform platform
COPY tenants tenants
COPY console console
COPY engine engine
COPY kernels kernels
COPY migrations migrations
# TORCH_SPEC picks the build: the default CUDA wheel for GPU hosts.
ARG TORCH_SPEC="torch>=2.4"
RUN pip install "$TORCH_SPEC" && pip install .

# Static files are collected at build time and served by WhiteNoise.
RUN SECRET_KEY=build-only-collectstatic SHUNTER_STATIC_MANIFEST=1 \
    shunter manage collectstatic --noinput

USER shunter
EXPOSE 8000
CMD ["shunter", "web", "--host", "0.0.0.0", "--port", "8000"]
