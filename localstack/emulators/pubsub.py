"""The Google Cloud Pub/Sub emulator as a context manager, for demos and tests.

    with PubSubEmulator() as emu:
        emu.apply_env()                       # PUBSUB_EMULATOR_HOST for clients here
        emu.create_topic("requests")
        subprocess.run([...], env={**os.environ, **emu.env()})

`gcloud beta emulators pubsub start` is a Python wrapper that spawns `java`; killing
the wrapper alone leaves java (and the port) behind. So the emulator runs in its own
process group and `stop()` kills the whole group.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from google.api_core import exceptions as gexc

from core.contracts import pubsub_io
from localstack.emulators.env_vars import AppliesEnv
from localstack.launch.processes import kill_group, track, untrack

DEFAULT_PROJECT = "local-agentic-rl"  # Beam refuses project ids not of the real form
INSTALL_HINT = (
    "install the Cloud SDK, its Pub/Sub emulator and a Java runtime, e.g. "
    "`apt-get install google-cloud-cli google-cloud-cli-pubsub-emulator "
    "openjdk-17-jre-headless` (Google's apt repository), or for a tarball SDK "
    "`gcloud components install beta pubsub-emulator` plus a Java 7+ JRE on PATH"
)
_PORT_IN_USE = ("Address already in use", "BindException")
# gcloud's words for a missing Java / component / command group.
_NOT_INSTALLED = ("JRE", "component", "Invalid choice", "not currently have")


class EmulatorUnavailable(RuntimeError):
    """gcloud, java or the emulator component is missing: nothing to start."""


class EmulatorStartError(RuntimeError):
    """The emulator was found but did not come up."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PubSubEmulator(AppliesEnv):
    def __init__(
        self,
        project: str = DEFAULT_PROJECT,
        *,
        log_dir: str | os.PathLike | None = None,
        gcloud_bin: str | None = None,
        startup_timeout_s: float = 60.0,
        port: int | None = None,
    ):
        self.project = project
        self.startup_timeout_s = startup_timeout_s
        self._gcloud_bin = gcloud_bin
        self._fixed_port = port
        self._owns_dir = log_dir is None
        self._dir = Path(log_dir) if log_dir else None
        self.host: str | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._saved_env: dict[str, str | None] | None = None
        self._publisher = None
        self._subscriber = None
        # What was made here, to make again after a restart (the emulator keeps all in memory).
        self._topics: list[str] = []
        self._subscriptions: dict[str, tuple[str, int]] = {}
        self.restarts = 0

    # ----------------------------------------------------------------- lifecycle
    @property
    def pid(self) -> int | None:
        """Pid of the gcloud wrapper, which is also the process-group id."""
        return self._proc.pid if self._proc else None

    def _check_installed(self) -> str:
        """Fail fast and clearly, before spawning, on a missing dependency."""
        gcloud = self._gcloud_bin or shutil.which("gcloud")
        if not gcloud or not os.access(gcloud, os.X_OK) or os.path.isdir(gcloud):
            raise EmulatorUnavailable(f"`gcloud` not found ({gcloud or 'PATH'}): {INSTALL_HINT}")
        if not shutil.which("java"):
            raise EmulatorUnavailable(f"`java` is not on PATH: {INSTALL_HINT}")
        # A recognised SDK layout (<root>/bin/gcloud) lets us check components offline;
        # `gcloud components list` needs the network.
        root = Path(os.path.realpath(gcloud)).parent.parent
        if (root / "lib" / "gcloud.py").is_file():
            missing = [
                name
                for name, rel in (
                    ("beta", "lib/surface/beta"),
                    ("pubsub-emulator", "platform/pubsub-emulator"),
                )
                if not (root / rel).exists()
            ]
            if missing:
                raise EmulatorUnavailable(f"gcloud at {root} lacks component(s) {', '.join(missing)}: {INSTALL_HINT}")
        return gcloud

    def start(self) -> PubSubEmulator:
        if self._proc is not None:
            return self
        gcloud = self._check_installed()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="pubsub-emulator-"))
        self._dir.mkdir(parents=True, exist_ok=True)
        # The port is free when probed but could be taken before java binds it: retry.
        for attempt in range(3):
            try:
                self._spawn_and_wait(gcloud, self._fixed_port or free_port())
                break
            except EmulatorStartError as err:
                if self._fixed_port or attempt == 2 or not any(s in str(err) for s in _PORT_IN_USE):
                    raise
        atexit.register(self.stop)  # last resort if nobody calls stop()
        return self

    def _spawn_and_wait(self, gcloud: str, port: int) -> None:
        self.host = f"127.0.0.1:{port}"
        self.log_path = self._dir / f"emulator-{port}.log"
        env = dict(os.environ, CLOUDSDK_CORE_DISABLE_PROMPTS="1", CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="1")
        data_dir = self._dir / f"data-{port}"  # isolated from ~/.config/gcloud; must exist
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            gcloud,
            "beta",
            "emulators",
            "pubsub",
            "start",
            f"--host-port={self.host}",
            f"--project={self.project}",
            f"--data-dir={data_dir}",
        ]
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )  # own process group
        track(self._proc.pid)
        deadline = time.monotonic() + self.startup_timeout_s
        # Ready = our java logged that it listens on the port AND it answers HTTP "Ok".
        # The log check matters: on a port race java logs a BindException but does not
        # exit, and whoever holds the port (another emulator?) might answer the GET.
        started = f"Server started, listening on {port}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        while True:
            exited, log = self._proc.poll() is not None, self.log_tail(20000)
            if exited or any(s in log for s in _PORT_IN_USE):
                self._kill_group()
                self._proc = None
                cls = EmulatorStartError  # a port race is retried by start()
                if not any(s in log for s in _PORT_IN_USE) and any(s in log for s in _NOT_INSTALLED):
                    cls, log = EmulatorUnavailable, f"{log[-3000:]}\n{INSTALL_HINT}"
                raise cls(f"pubsub emulator failed to start; log {self.log_path}:\n{log[-3000:]}")
            if started in log:
                with contextlib.suppress(OSError):
                    with opener.open(f"http://{self.host}/", timeout=1.0) as resp:
                        if resp.status == 200:
                            return
            if time.monotonic() > deadline:
                self._kill_group()  # keep the log directory: the error points at it
                self._proc = None
                raise EmulatorStartError(
                    f"pubsub emulator not ready after {self.startup_timeout_s}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def alive(self) -> bool:
        """The emulator's process (gcloud's wrapper, java's parent) is still running."""
        return self._proc is not None and self._proc.poll() is None

    def restart(self, down_s: float = 0.0) -> None:
        """Start the emulator again on the same port (after a crash, or to make one: it is
        stopped first if running) and make its topics and subscriptions again. What they
        held is gone, as it is from a real outage's point of view of in-flight work; the
        clients' channels reconnect by themselves."""
        if self.host is None:
            raise RuntimeError("emulator not started")
        port = int(self.host.rsplit(":", 1)[1])
        self._kill_group()
        time.sleep(down_s)
        self._spawn_and_wait(self._check_installed(), port)
        self.restarts += 1
        for topic in self._topics:
            self.create_topic(topic)
        for name, (topic, ack_deadline_s) in self._subscriptions.items():
            self.create_subscription(name, topic, ack_deadline_s)

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except (OSError, AttributeError):
            return ""

    def _kill_group(self, term_grace_s: float = 5.0) -> None:
        if self._proc is not None:
            kill_group(self._proc, term_grace_s)
            untrack(self._proc.pid)

    def stop(self) -> None:
        """Kill the whole process group (SIGTERM, then SIGKILL). Idempotent."""
        atexit.unregister(self.stop)
        for client in (self._publisher, self._subscriber):
            with contextlib.suppress(Exception):  # best effort: the server goes anyway
                client.transport.close()
        self._publisher = self._subscriber = None
        self.restore_env()
        self._kill_group()
        self._proc = self.host = None
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PubSubEmulator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- environment
    def env(self) -> dict[str, str]:
        """Variables a client or subprocess needs to talk to this emulator."""
        if self.host is None:
            raise RuntimeError("emulator not started")
        return {pubsub_io.EMULATOR_ENV: self.host, pubsub_io.PROJECT_ENV: self.project}

    # -------------------------------------------------------------------- admin
    def _path(self, kind: str, name: str) -> str:
        if name.startswith("projects/"):
            return name
        if len(name) < 3:  # the emulator refuses these with a less clear error
            raise ValueError(f"Pub/Sub names need at least 3 characters: {name!r}")
        return f"projects/{self.project}/{kind}/{name}"

    def topic_path(self, name: str) -> str:
        return self._path("topics", name)

    def subscription_path(self, name: str) -> str:
        return self._path("subscriptions", name)

    def publisher(self):
        if self._publisher is None:
            self._publisher = pubsub_io.publisher_client(host=self.env()[pubsub_io.EMULATOR_ENV])
        return self._publisher

    def subscriber(self):
        if self._subscriber is None:
            self._subscriber = pubsub_io.subscriber_client(host=self.env()[pubsub_io.EMULATOR_ENV])
        return self._subscriber

    def create_topic(self, name: str) -> str:
        """Create the topic if needed; returns its full path."""
        path = self.topic_path(name)
        with contextlib.suppress(gexc.AlreadyExists):
            self.publisher().create_topic(request={"name": path})
        if name not in self._topics:
            self._topics.append(name)
        return path

    def create_subscription(self, name: str, topic: str, ack_deadline_s: int = 60) -> str:
        """Create a pull subscription on ``topic`` if needed; returns its full path."""
        path = self.subscription_path(name)
        with contextlib.suppress(gexc.AlreadyExists):
            self.subscriber().create_subscription(
                request={"name": path, "topic": self.topic_path(topic), "ack_deadline_seconds": int(ack_deadline_s)}
            )
        self._subscriptions[name] = (topic, ack_deadline_s)
        return path
