"""`python -m eyas.launch.serve` as users start it: a real subprocess on a free 127.0.0.1 port."""

import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from support import cli_on_tiny

MODEL = "target"  # the shipped target's directory name
# code prompts for the shipped code model the server runs; what it serves is compared with the offline engine's
SERVED_PROMPTS = ["def fibonacci(n):", "import numpy as np\n", "class Stack:\n    def push(self, x):",
                  "for i in range(10):", "# sort a list of numbers\n", "def read_file(path):\n    with open(path) as f:"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_reply(conn: socket.socket) -> bytes:
    """One HTTP reply off a raw socket: its head, then as much body as its Content-Length declares (they may
    arrive in separate segments); up to the connection's close when it declares none."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        part = conn.recv(4096)
        if not part:
            return reply
        reply += part
    head, _, body = reply.partition(b"\r\n\r\n")
    declared = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while declared is None or len(body) < int(declared.group(1)):
        part = conn.recv(4096)
        if not part:
            break
        body += part
    return head + b"\r\n\r\n" + body


class ServerProcess:
    def __init__(self, *overrides: str, cwd: Path | None = None, startup_s: float = 180, as_written: bool = False):
        """On the tiny model unless `overrides` choose a model group, or `as_written` (the package's default)."""
        self.port = free_port()
        overrides = overrides if as_written else cli_on_tiny(overrides)
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eyas.launch.serve", f"server.port={self.port}", *overrides],
            cwd=cwd or tempfile.mkdtemp(prefix="eyas-serve-"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not become healthy")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: bytes) -> tuple[int, dict]:
        """POST raw bytes as JSON; (status, parsed reply)."""
        request = urllib.request.Request(self.base + path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def metric(self, name: str) -> float:
        text = self.get("/metrics")[1]
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.M)
        return float(match.group(1))

    def wait_idle(self, timeout_s: float = 30) -> None:
        """Until no request runs or waits and no KV page is held."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (self.metric("eyas_kv_pages_used") == 0 and self.metric("eyas_requests_running") == 0
                    and self.metric("eyas_requests_waiting") == 0):
                return
            time.sleep(0.1)
        raise AssertionError(f"server not idle: {self.get('/metrics')[1]}")

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out
