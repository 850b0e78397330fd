"""The learner's compiles persist where a restarted or re-run job finds them: beside its
checkpoints by default (Vertex AI's AIP_CHECKPOINT_DIR), a flag's directory, or the
environment's JAX_COMPILATION_CACHE_DIR, which JAX reads itself."""

from trainer.task import compile_cache_dir, parse_config

BASE = ["--requests_topic=t", "--records_subscription=s", "--policy_root=/p"]


def test_the_compile_cache_sits_beside_the_checkpoints_unless_told_otherwise():
    assert compile_cache_dir(parse_config(BASE), environ={}) is None  # nowhere durable to put it
    ckpt = parse_config([*BASE, "--checkpoint_dir=gs://b/run/checkpoints/"])
    assert compile_cache_dir(ckpt, environ={}) == "gs://b/run/checkpoints/xla_cache"
    flag = parse_config([*BASE, "--checkpoint_dir=/c", "--compile_cache_dir=/cache"])
    assert compile_cache_dir(flag, environ={}) == "/cache"
    assert compile_cache_dir(flag, environ={"JAX_COMPILATION_CACHE_DIR": "/env"}) is None
