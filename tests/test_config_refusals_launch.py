"""Settings the launchers refuse at start-up: the evaluator (`python -m rollout.evaluator`),
the demo (`python -m localstack.launch.demo`) and the Vertex AI launcher
(`python -m trainer.cloud.vertex`). Each row is checked by tests/_refusals.py;
docs/CONFIG_REFUSALS.md is generated from these tables."""

from __future__ import annotations

from tests._refusals import CHOICE, DEMO, EVALUATOR, VERTEX, Row, checks, row

E = EVALUATOR
_SA = "learner@my-project.iam.gserviceaccount.com"

TABLE: list[Row] = [
    # ---- the evaluator: python -m rollout.evaluator -------------------------------
    row(E, "--out", (), "missing", "scores written nowhere", "--out",
        "the following arguments are required: --out", unset=("--out",)),
    row(E, "--model_config", "--model_config=huge", CHOICE, "no such model size",
        "--model_config", "argument --model_config: invalid choice: 'huge'"),
    row(E, "--env_config", "--env_config={bad", "not JSON", "the environment's settings cannot be read",
        "--env_config", "argument --env_config: '{bad' is not a JSON object"),
    row(E, "--modes", "--modes=beam", "a mode other than sampled, greedy", "no such way to decode",
        "--modes", "--modes must name some of ('sampled', 'greedy')"),
    row(E, "--modes", "--modes=,", "empty", "an evaluation that scores nothing",
        "--modes", "--modes must name some of ('sampled', 'greedy')"),
    row(E, "--n", "--n=-1", "< 0", "a negative number of held-out tasks", "n", "n must be >= 0"),
    row(E, "--env", "--env=chess", "not a registered environment", "no held-out tasks",
        "env", "unknown environment 'chess'"),
    row(E, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=0", "< 1", "turns that generate nothing",
        "max_new_tokens_per_turn", "max_new_tokens_per_turn must be >= 1"),
    row(E, "--max_tokens", "--max_tokens=0", "< 1", "episodes that cannot hold their prompt",
        "max_tokens", "max_tokens must be >= 1"),
    row(E, "--max_tokens", "--max_tokens=512", "> the model's context (tiny: 256)",
        "a KV cache longer than the model's context", "max_tokens", "sampler length 512 exceeds the model's"),
    row(E, "--slots", "--slots=0", "< 1", "a sampler that decodes no episode", "slots", "slots must be >= 1"),
    # ---- the demo: python -m localstack.launch.demo ----------------------------------------
    row(DEMO, "--live", "--live=tv", CHOICE, "no such progress display", "--live",
        "argument --live: invalid choice: 'tv'"),
    row(DEMO, "--max_restarts", "--max_restarts=-1", "< 0", "no number of restarts", "max_restarts",
        "max_restarts must be >= 0"),
    row(DEMO, "--learner_processes", "--learner_processes=0", "< 1 or > 8", "no learner, or more processes than this "
        "machine should start", "learner_processes", "learner_processes must be >= 1"),
    row(DEMO, "--rollout_cpus", "--rollout_cpus=0,a", "not a comma-separated list of core numbers",
        "no cores to pin the rollout side to", "rollout_cpus", "--rollout_cpus must be comma-separated core numbers"),
    row(DEMO, "--env_config", ("--env=guess", '--env_config={"colour": 1}'), "not a setting of the --env",
        "every process would refuse it after the warm start began", "--env_config",
        "GuessConfig.__init__() got an unexpected keyword argument 'colour' (--env 'guess', --env_config"),
    row(DEMO, "--max_new_tokens_per_turn", "--max_new_tokens_per_turn=0", "< 1", "a model turn that writes nothing",
        "max_new_tokens_per_turn", "max_new_tokens_per_turn must be >= 1"),
    # ---- the Vertex AI launcher: python -m trainer.cloud.vertex ---------------------
    row(VERTEX, "--project", "--project=My_Project", "not a GCP project id", "a job the API refuses after upload",
        "project", "project must be a GCP project id"),
    row(VERTEX, "--region", "--region=us-central1-a", "a zone or not a region", "Vertex AI jobs live in regions",
        "region", "region must be a region like us-central1 (zones are refused)"),
    row(VERTEX, "--image", "--image=learner", "not a container image URI", "no container to run",
        "image", "image must be a container image URI"),
    row(VERTEX, "--base_output_dir", "--base_output_dir=/tmp/learner", "not gs://bucket[/path]",
        "Vertex AI derives the model and checkpoint dirs from a GCS prefix", "base_output_dir",
        "base_output_dir must be a gs://bucket[/path] URI"),
    row(VERTEX, "--staging_bucket", "--staging_bucket=s3://bucket", "not gs://bucket[/path]",
        "the SDK stages to GCS only", "staging_bucket", "staging_bucket must be a gs://bucket[/path] URI"),
    row(VERTEX, "--display_name", "--display_name=", "empty or over 128 characters", "the API's limits",
        "display_name", "display_name must be 1-128 characters"),
    row(VERTEX, "--replica_count", "--replica_count=0", "< 1", "a job with no learner host",
        "replica_count", "replica_count must be >= 1"),
    row(VERTEX, "--service_account", "--service_account=learner", "not an email",
        "no identity to run the job as", "service_account", "service_account must be an email"),
    row(VERTEX, "--tensorboard", "--tensorboard=projects/my-project/locations/us-central1/tensorboards/1",
        "given without --service_account", "Vertex AI uploads the logs only as the job's own service account",
        "tensorboard", "tensorboard needs service_account"),
    row(VERTEX, "--tensorboard", (f"--service_account={_SA}", "--tensorboard=tb-1"),
        "not projects/P/locations/L/tensorboards/ID", "no TensorBoard instance to attach", "tensorboard",
        "tensorboard must be projects/PROJECT/locations/REGION/tensorboards/ID"),
    row(VERTEX, "--tensorboard",
        (f"--service_account={_SA}", "--tensorboard=projects/my-project/locations/europe-west4/tensorboards/1"),
        "in another region than --region", "Vertex AI wants the TensorBoard in the job's region", "tensorboard",
        "tensorboard 'projects/my-project/locations/europe-west4/tensorboards/1' is in europe-west4, the job in"),
    row(VERTEX, "--env", "--env=DEBUG", "not NAME=VALUE", "a variable with no value", "env",
        "env must be NAME=VALUE items"),
    row(VERTEX, "--env", "--env=AIP_MODEL_DIR=gs://b/m", "an invalid or Vertex-reserved name",
        "overriding Vertex's own variables would mislead trainer.cloud.distributed", "env",
        "env must be NAME=VALUE items, no NAME reserved by Vertex AI"),
    row(VERTEX, "--tpu_topology", "--tpu_topology=", "empty on a TPU machine type",
        "Vertex AI needs the slice's topology", "tpu_topology",
        "TPU machine type ct5lp-hightpu-4t needs a tpu_topology"),
    row(VERTEX, "--machine_type", "--machine_type=n1-standard-8", "not a TPU type while a topology is given",
        "a TPU topology for a machine with no TPU", "tpu_topology", "tpu_topology given for non-TPU machine type"),
    row(VERTEX, "--tpu_topology", "--tpu_topology=2by2", "not like 2x2 or 2x2x1", "no slice shape",
        "tpu_topology", "tpu_topology must be like 2x2 or 2x2x1"),
    row(VERTEX, "--tpu_topology", "--tpu_topology=1x2", "chips not a multiple of the chips per host",
        "a slice the hosts cannot fill", "tpu_topology", "topology 1x2 (2 chips) does not fill"),
    row(VERTEX, "-- (learner flags)", ("--", "--loss=sgd"), "refused by trainer.task's parser",
        "a typo fails here, not on a TPU", "learner args", "trainer.task refuses the learner args"),
]  # fmt: skip

test_refused_with_documented_message, test_message_names_the_field, test_refused_before_anything_starts = checks(TABLE)
