"""A scripted OpenAI-compatible streaming server for the load generator's tests.

Each request's script is the JSON text of its last chat message (or its completions prompt):
``{"chunks": ["a", "b"], "delays": [0.2, 0.1], "usage": 2}`` streams chunk ``k`` after
sleeping ``delays[k]`` seconds, then a usage chunk (when ``usage`` is given) and
``data: [DONE]``. Other keys: ``status`` (answer with that HTTP status and an OpenAI error
object), ``reset_after`` (reset the connection after that many chunks), ``hang`` (sleep that
many seconds first), ``no_done`` (close without ``[DONE]``), ``error_event`` (send an error
event instead of the chunks). Every stream opens with a role-only chunk and a ``: keepalive``
comment, as real servers send (neither carries text). A prompt that is not a script gets
the server's ``default`` script (``DEFAULT``). With ``loading_s``, every request in the first
``loading_s`` seconds after the server starts gets 503 and an OpenAI error object (as
llama.cpp's server answers while it loads its model), while ``/health`` answers 200 from the
start (as mlx_lm.server does). Binds 127.0.0.1 on a free port.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT = {"chunks": ["x", "y", "z"], "delays": [0.0, 0.0, 0.0], "usage": 3}


class FakeServer:
    """The server on a thread; ``bodies`` holds every request body, ``timings`` for each
    request ``(received, [write time of each text chunk])`` (``time.perf_counter``), and
    ``max_in_flight`` the most requests it served at once."""

    def __init__(self, default: dict | None = None, loading_s: float = 0.0) -> None:
        self.default = DEFAULT if default is None else default
        self.loaded_at = time.perf_counter() + loading_s
        self.bodies: list[dict] = []
        self.timings: list[tuple[float, list[float]]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = _Quiet(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def enter(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a reset connection's handler fails on its closed socket: expected


def _script(body: dict, default: dict) -> dict:
    text = body["messages"][-1]["content"] if "messages" in body else body.get("prompt")
    try:
        script = json.loads(text)
    except (TypeError, ValueError):
        return default
    return script if isinstance(script, dict) else default


def _handler(server: FakeServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            payload = {"/health": {}, "/v1/models": {"data": [{"id": "fake-model"}]}}
            if self.path not in payload:
                self.send_error(404)
                return
            self._json(200, payload[self.path])

        def _json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _event(self, obj) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.writes: list[float] = []
            server.timings.append((time.perf_counter(), self.writes))
            server.bodies.append(body)
            server.enter()
            self.left = False
            try:
                if time.perf_counter() < server.loaded_at:
                    self._json(503, {"error": {"message": "Loading model", "code": 503,
                                               "type": "unavailable_error"}})
                    return
                self._stream(body, _script(body, server.default))
            finally:
                if not self.left:
                    server.leave()

        def _stream(self, body: dict, script: dict) -> None:
            time.sleep(script.get("hang", 0))
            if "status" in script:
                self._json(script["status"], {"error": {
                    "message": "scripted failure", "type": "server_error", "param": None,
                    "code": script["status"]}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chat = "messages" in body
            self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
                        if chat else {"choices": [{"index": 0, "text": ""}]})
            self.wfile.write(b": keepalive\n\n")
            if script.get("error_event"):
                self._event({"error": {"message": "scripted error event", "code": 500}})
                return
            for k, (text, delay) in enumerate(zip(script["chunks"], script["delays"])):
                if k == script.get("reset_after"):
                    return self._reset()
                time.sleep(delay)
                self._event({"choices": [{"index": 0, "delta": {"content": text}}]} if chat
                            else {"choices": [{"index": 0, "text": text}]})
                self.writes.append(time.perf_counter())
            if script.get("no_done"):
                return
            if script.get("usage") is not None:
                self._event({"choices": [], "usage": {"prompt_tokens": 7,
                                                      "completion_tokens": script["usage"]}})
            # NOTE: out of flight before [DONE]: the client may send its next request as soon
            # as it reads it, before this handler returns
            self.left = True
            server.leave()
            self._event("[DONE]")

        def _reset(self) -> None:
            """Close with a TCP reset (SO_LINGER 0), as a crashed server's socket does."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()

    return Handler
