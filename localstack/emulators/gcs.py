"""A local Cloud Storage server (the `gcp-storage-emulator` package) for demos and tests.

    with GcsEmulator(bucket="policies") as gcs:
        gcs.apply_env()          # for clients in this process
        subprocess.run([...], env={**os.environ, **gcs.env()})

Clients find it through environment variables, read when a client is created:
- google-cloud-storage: STORAGE_EMULATOR_HOST (it then uses anonymous credentials);
- TensorStore's gcs driver (what Orbax writes through): TENSORSTORE_GCS_HTTP_URL, plus
  GOOGLE_AUTH_TOKEN_FOR_TESTING so it sends a fixed bearer token instead of looking
  for Application Default Credentials (the emulator accepts any token);
- gcsfs (what etils.epath, hence Orbax's small files, uses for gs://): STORAGE_EMULATOR_HOST;
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false skips its bucket-type probe, which calls the
  Storage Control API the emulator lacks (one warning per call otherwise).
The server runs in-memory in its own process group; stop() kills the whole group.

Those clients cache the endpoint they first saw (gcsfs instances, Orbax's bucket cache),
so a process should talk to one emulator for its lifetime: tests use `shared()`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Self

from localstack.emulators.env_vars import AppliesEnv
from localstack.launch.processes import ProcessGroup

DEFAULT_PROJECT = "local-agentic-rl"
DEFAULT_BUCKET = "local-policy-store"
_PORT_IN_USE = "Address already in use"
_READY = "gcs emulator listening on {port}"


class GcsEmulatorError(RuntimeError):
    """The emulator is not installed or did not come up."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class GcsEmulator(AppliesEnv):
    def __init__(
        self,
        bucket: str = DEFAULT_BUCKET,
        project: str = DEFAULT_PROJECT,
        *,
        log_dir: str | os.PathLike | None = None,
        startup_timeout_s: float = 30.0,
        verbose: bool = False,
    ):
        self.bucket, self.project = bucket, project
        self.startup_timeout_s, self.verbose = startup_timeout_s, verbose
        self._owns_dir = log_dir is None
        self._dir = Path(log_dir) if log_dir else None
        self.url: str | None = None
        self._group: ProcessGroup | None = None
        self._saved_env: dict[str, str | None] | None = None
        # The emulator is local: never route it through an HTTP(S)_PROXY from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def pid(self) -> int | None:
        return self._group.pid if self._group else None

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> GcsEmulator:
        if self._group is not None:
            return self
        try:
            import gcp_storage_emulator  # noqa: F401  (fail fast with a clear message)
        except ImportError as e:
            raise GcsEmulatorError("`pip install gcp-storage-emulator` (in the test extras)") from e
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="gcs-emulator-"))
        self._dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # a probed-free port can be taken before the server binds it
            try:
                self._spawn_and_wait(free_port())
                break
            except GcsEmulatorError as err:
                if attempt == 2 or _PORT_IN_USE not in str(err):
                    raise
        atexit.register(self.stop)  # last resort if nobody calls stop()
        self.create_bucket(self.bucket)
        return self

    def _spawn_and_wait(self, port: int) -> None:
        repo = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
        code = f"from localstack.emulators.gcs import serve; serve({port}, quiet={not self.verbose})"
        # cwd: the emulator may create ./.cloudstorage even in memory mode; keep it in our dir.
        self._group = ProcessGroup(
            [sys.executable, "-c", code], self._dir / f"gcs-emulator-{port}.log", env=env, cwd=str(self._dir)
        ).start()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            log = self._group.log_tail(20000)
            # A failed bind kills only the server thread and the process would idle forever:
            # look for the error rather than wait for the timeout.
            if self._group.poll() is not None or _PORT_IN_USE in log:
                self._fail(f"gcs emulator failed to start:\n{log[-3000:]}")
            # Ready = our child says it bound the port AND it answers the health check.
            if _READY.format(port=port) in log:
                with contextlib.suppress(OSError), self._opener.open(f"{self.url}/", timeout=1.0) as resp:
                    if resp.status == 200 and resp.read() == b"OK":
                        return
            if time.monotonic() > deadline:
                self._fail(f"gcs emulator not ready after {self.startup_timeout_s}s:\n{log[-3000:]}")
            time.sleep(0.05)

    def _fail(self, message: str):
        self._group.stop()
        self._group = self.url = None
        raise GcsEmulatorError(message)

    def stop(self) -> None:
        """Kill the process group and restore the environment. Idempotent."""
        atexit.unregister(self.stop)
        self.restore_env()
        if self._group is not None:
            self._group.stop(term_grace_s=2.0)
        self._group = self.url = None
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- environment
    def env(self) -> dict[str, str]:
        if self.url is None:
            raise RuntimeError("emulator not started")
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator-token",
            "GOOGLE_CLOUD_PROJECT": self.project,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def uri(self, *parts: str) -> str:
        """gs://<bucket>/<parts...>"""
        return "/".join([f"gs://{self.bucket}", *parts])

    # -------------------------------------------------------------------- admin
    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with self._opener.open(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def create_bucket(self, name: str) -> None:
        status, body = self._request("POST", f"/storage/v1/b?project={self.project}", {"name": name})
        if status not in (200, 409):  # 409: it exists already
            raise GcsEmulatorError(f"creating bucket {name}: HTTP {status} {body[:300]!r}")

    def list_objects(self, prefix: str = "", bucket: str | None = None) -> list[str]:
        """Object names under prefix (all pages); for tests and debugging."""
        names, token = [], ""
        while True:
            q = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
            status, body = self._request("GET", f"/storage/v1/b/{bucket or self.bucket}/o?{q}")
            if status != 200:
                raise GcsEmulatorError(f"listing {prefix}: HTTP {status} {body[:300]!r}")
            page = json.loads(body)
            names += [item["name"] for item in page.get("items", [])]
            if not (token := page.get("nextPageToken")):
                return names


def serve(port: int, quiet: bool = True) -> None:
    """Child-process entry point: `gcp-storage-emulator start --in-memory`, plus what
    TensorStore's gcs driver needs and the emulator lacks. Its media downloads carry no
    x-goog-generation header and ignore ifGenerationMatch/ifGenerationNotMatch. TensorStore
    then records generation 0 for a re-read OCDBT manifest and its next conditional write
    fails with "Malformed StorageGeneration" (seen in ~1 of 45 publishes). Real GCS sends
    the header, answers 304 / 412: so do we."""
    import logging
    from http import HTTPStatus

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    original = objects.download

    def download(request, response, storage, *args, **kwargs):
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except NotFound:
            return original(request, response, storage, *args, **kwargs)
        generation = str(obj["generation"])
        response["x-goog-generation"] = generation
        response["x-goog-metageneration"] = str(obj.get("metageneration") or 1)
        if request.query.get("ifGenerationNotMatch", [None])[0] == generation:
            response.status = HTTPStatus.NOT_MODIFIED
            return None
        if request.query.get("ifGenerationMatch", [generation])[0] != generation:
            response.status = HTTPStatus.PRECONDITION_FAILED
            return None
        return original(request, response, storage, *args, **kwargs)

    objects.download = download  # objects.get (alt=media) looks the name up per call
    server.HANDLERS = tuple(
        (rx, {m: download if f is original else f for m, f in h.items()}) for rx, h in server.HANDLERS
    )
    logging.basicConfig(level=logging.CRITICAL if quiet else logging.DEBUG)
    emulator = server.create_server("127.0.0.1", port, in_memory=True)
    emulator.start()  # returns once bound; a failed bind logs the error and never returns
    print(_READY.format(port=port), flush=True)
    while True:  # serve until SIGTERM / SIGKILL from the parent's ProcessGroup
        time.sleep(3600)


_shared: GcsEmulator | None = None


def shared() -> GcsEmulator:
    """One emulator per process, started on first use and stopped at exit (atexit)."""
    global _shared
    if _shared is None or _shared.url is None:
        _shared = GcsEmulator().start()
    return _shared
