# verinfer: the validator node, executer mode and the local devnet demo, CPU only.
#
#   docker build -t verinfer .
#   docker run --rm verinfer --help
#   docker run --rm -v "$PWD/devnet-out:/app/devnet-out" verinfer devnet        # ~2 minutes on 2 cores
#   docker run --rm -v "$PWD/keys:/app/keys:ro" -v "$PWD/data:/app/data" -p 9464:9464 \
#       verinfer validator run --config /app/keys/validator.toml
#
# The image runs scripts/setup (the same set-up as the README's first command) without the vLLM venv,
# with torch from PyTorch's CPU index (a CUDA build would add several GB), and converts SmolLM2's
# GGUF weights at build time so that a container starts without it.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VERINFER_TORCH_INDEX=https://download.pytorch.org/whl/cpu \
    VERINFER_SKIP_VLLM=1 \
    VERINFER_CACHE=/opt/verinfer-cache

# gcc + libgmp-dev: libp2p's fastecdsa compiles; nodejs + npm: the contracts' toolchain (solc-js, anvil)
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential libgmp-dev nodejs npm ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 verinfer
WORKDIR /app
COPY --chown=verinfer:verinfer . .
RUN mkdir -p "$VERINFER_CACHE" && chown verinfer:verinfer "$VERINFER_CACHE"
USER verinfer

RUN bash scripts/setup \
    && .venv/bin/python -c "from node.engines.models import get_model_spec as s, materialise_model as m; \
m(s('smollm2-135m-instruct'))" \
    && .venv/bin/verinfer --help >/dev/null

EXPOSE 8000 9464 4001 4002
ENTRYPOINT ["/app/.venv/bin/verinfer"]
CMD ["--help"]
