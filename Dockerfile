# One image for every stepq service.  EXTRAS=vllm builds the GPU worker image
# (vLLM brings its own CUDA build of torch); the default image runs the dispatcher,
# migrations, Flower and workers with the synthetic or remote (OpenAI-compatible) backends.
FROM python:3.11-slim
ARG EXTRAS=flower
WORKDIR /app
# A C compiler where the image runs vLLM or trains: Triton (vLLM's kernels, torch.compile)
# builds its launchers with one at first use, and the slim base has none.  Python's headers
# come with the base image.
RUN case ",${EXTRAS}," in \
      *,vllm,*|*,train,*) apt-get update \
        && apt-get install -y --no-install-recommends gcc g++ libc6-dev \
        && rm -rf /var/lib/apt/lists/* ;; \
    esac
# One copy of the tree: .dockerignore lets in only the package sources and their packaging.
COPY . ./
RUN pip install --no-cache-dir ".[${EXTRAS}]" \
    && useradd --create-home --uid 10001 stepq \
    && mkdir -p /runs && chown stepq /runs
# An unprivileged user: a compromised task cannot own the container (mounted run folders
# must be writable by uid 10001).
USER stepq
WORKDIR /home/stepq
ENTRYPOINT ["stepq"]
CMD ["--help"]
