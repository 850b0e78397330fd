# Learner image for the Vertex AI custom job (trainer/cloud/vertex.py): `python -m trainer.task`
# on a Cloud TPU slice. Not built in this repository's CI (no docker engine there).
#
#   docker build -t us-docker.pkg.dev/$PROJECT/rl/learner:v1 .
#   docker push us-docker.pkg.dev/$PROJECT/rl/learner:v1
FROM python:3.11-slim

# No .pyc litter, unbuffered logs (Cloud Logging reads stdout as it comes).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

# bubblewrap and libseccomp: the "code" environment's sandbox and its syscall filter. Without
# bubblewrap the sandbox falls back to rlimits only, without libseccomp it runs unfiltered;
# either way it says so.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap libseccomp2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# The distribution first (its own layer), then the packages setup.py finds. Copied by
# name: a plain `COPY . .` would also copy .venv/ and run outputs.
COPY setup.py ./
COPY environments/ environments/
COPY trainer/ trainer/
COPY pipelines/ pipelines/
COPY localstack/ localstack/

# jax[tpu] pulls the matching jaxlib and libtpu wheels from PyPI: the install line of the
# current JAX docs ("TPU (Google Cloud TPU VM)": pip install -U "jax[tpu]"). The pin keeps
# it inside setup.py's jax range; older JAX releases needed
# `-f https://storage.googleapis.com/jax-releases/libtpu_releases.html` as well.
RUN pip install --upgrade pip \
    && pip install . "jax[tpu]>=0.10,<0.11"

# Fail the build, not the TPU job, if the learner cannot even be imported.
RUN python -c "import trainer.task, trainer.cloud.distributed"

ENTRYPOINT ["python", "-m", "trainer.task"]
