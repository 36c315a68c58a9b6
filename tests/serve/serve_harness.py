"""Real server processes for the `serve` tests (tests/serve/serve_test.py).

A Server is `infoflow_sp` with job = "serve" started on 1 rank or under mpirun on P ranks, on a
port the server picks itself (serve.port = 0, read from its "listening on" line), waited for
until /health says 200, and stopped at the end; every process it started (mpirun and each rank,
found by a marker in their environment) is checked to be gone, and killed and reported if not.
The oracle is the `answer` job run the same way on the same config.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def mpi_env():
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_mpi_yield_when_idle": "1", "OMP_WAIT_POLICY": "passive",
                "INFOFLOW_PROGRESS": "0"})
    return env


def command(binary, mpiexec, np, args, mpi_flags=()):
    if np == 1:
        return [binary] + list(args)
    return [mpiexec, "-n", str(np), "--oversubscribe", "--bind-to", "none", *mpi_flags,
            binary] + list(args)


def marked_pids(marker):
    """PIDs of the processes whose environment holds INFOFLOW_SERVE_TEST=marker."""
    needle = ("INFOFLOW_SERVE_TEST=" + marker).encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def rank_pid(marker, rank):
    """The PID of MPI rank `rank` among the processes marked `marker`."""
    for pid in marked_pids(marker):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm == "infoflow_sp" and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return pid
    return None


class Server:
    """infoflow_sp serving `config` (a path) with `sets` (--set arguments)."""

    def __init__(self, binary, mpiexec, np, config, sets=(), env=None, mpi_flags=(),
                 ready_timeout=240):
        self.np = np
        self.marker = uuid.uuid4().hex
        self.log_path = tempfile.mktemp(prefix="serve-test-", suffix=".log")
        e = mpi_env()
        e.update(env or {})
        e["INFOFLOW_SERVE_TEST"] = self.marker
        args = ["--config", config, "--set", "serve.port=0"]
        for s in sets:
            args += ["--set", s]
        self.cmd = command(binary, mpiexec, np, args, mpi_flags)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=e, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.port = None
        self.rc = None
        deadline = time.monotonic() + ready_timeout
        while self.port is None:
            m = re.search(r"listening on http://[^:]+:(\d+)", self.output())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise Fail(f"the server exited ({self.proc.returncode}) before listening:\n"
                           + self.output())
            check(time.monotonic() < deadline, "the server did not listen in time:\n"
                  + self.output())
            time.sleep(0.05)
        self.loading_status = None
        while True:
            try:
                status, _ = self.get("/health")
            except OSError:
                status = None
            if self.loading_status is None and status is not None:
                self.loading_status = status  # the first answer: 503 while loading
            if status == 200:
                break
            if self.proc.poll() is not None:
                raise Fail(f"the server exited ({self.proc.returncode}) while loading:\n"
                           + self.output())
            check(time.monotonic() < deadline, "the server was not ready in time:\n"
                  + self.output())
            time.sleep(0.1)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def output(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def conn(self, timeout=300):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=300):
        c = self.conn(timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            raw = r.read()
            return r.status, raw, dict(r.getheaders())
        finally:
            c.close()

    def get(self, path, timeout=30):
        status, raw, _ = self.request("GET", path, timeout=timeout)
        return status, raw

    def post_json(self, path, body, headers=None, timeout=300):
        status, raw, h = self.request("POST", path, body, headers, timeout)
        return status, json.loads(raw) if raw else None, h

    def metrics(self):
        status, raw = self.get("/metrics")
        check(status == 200, f"/metrics said {status}")
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def pid_of_rank(self, rank):
        return rank_pid(self.marker, rank) if self.np > 1 else self.proc.pid

    def signal_rank0(self, sig):
        os.kill(self.pid_of_rank(0), sig)

    def wait(self, timeout):
        """Waits for the launcher to exit; returns (rc, seconds) or raises on a timeout."""
        t0 = time.monotonic()
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Fail(f"the server did not exit within {timeout} s:\n" + self.output())
        return self.rc, time.monotonic() - t0

    def stop(self, expect_rc=0, timeout=60):
        """SIGTERM to rank 0 (the server drains and exits 0), then the processes are checked."""
        if self.proc.poll() is None:
            try:
                self.signal_rank0(signal.SIGTERM)
            except (ProcessLookupError, TypeError):
                pass
            self.wait(timeout)
        rc = self.proc.returncode
        self.check_gone()
        if expect_rc is not None:
            check(rc == expect_rc, f"the server exited {rc}, expected {expect_rc}:\n"
                  + self.output()[-4000:])
        return rc

    def check_gone(self, grace=15):
        """Every process of this server has ended (killed and reported otherwise)."""
        t0 = time.monotonic()
        while marked_pids(self.marker) and time.monotonic() - t0 < grace:
            time.sleep(0.1)
        left = marked_pids(self.marker)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        check(not left, f"processes left behind after the server ended: {left}")

    def kill(self):
        """Ends everything at once (a failed test's cleanup)."""
        for pid in marked_pids(self.marker) + [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def run_answer(binary, mpiexec, np, config, documents, question, sets=(), system=""):
    """The `answer` job's JSON result for the same request on `np` ranks (the oracle)."""
    with tempfile.TemporaryDirectory() as tmp:
        docs = os.path.join(tmp, "docs.jsonl")
        with open(docs, "w") as f:
            for d in documents:
                f.write(json.dumps({"text": d}) + "\n")
        out = os.path.join(tmp, "r.json")
        args = ["--config", config, "--set", "job=answer", "--set", f"request.documents_file={docs}",
                "--set", f"request.question={question}", "--set", f"request.system={system}",
                "--out", out]
        for s in sets:
            args += ["--set", s]
        p = subprocess.run(command(binary, mpiexec, np, args), cwd=ROOT, env=mpi_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)
        check(p.returncode == 0, f"the answer job failed ({p.returncode}):\n{p.stdout}")
        with open(out) as f:
            return json.load(f)


def sse_events(resp):
    """Yields the data lines of a server-sent event stream (an http.client response) as they
    arrive."""
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data: "):
                    yield line[6:].decode()
