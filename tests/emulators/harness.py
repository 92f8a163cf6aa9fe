"""What the Kubernetes and Ray emulators share: the HTTP/1.1 JSON server and its shutdown, the
processes they run for what they are given (each in its own session, its output in a log, watched
by a thread), and the background loop that places waiting work. Each emulator keeps its API's
wire format; this file knows none.
"""

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    """Answers every method through route(method); reply() writes JSON, or text for a str."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def route(self, method):
        raise NotImplementedError

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def reply(self, status, body):
        if isinstance(body, str):
            data, ctype = body.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(body).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def do_PUT(self):
        self.route("PUT")

    def do_PATCH(self):
        self.route("PATCH")


def spawn(argv, workdir, env, log_path, on_exit):
    """Runs argv in its own session (so kill_group takes its whole tree) with stdout and stderr in
    log_path; on_exit(proc, returncode) is called from a thread of its own when it ends."""
    os.makedirs(workdir, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    threading.Thread(target=lambda: on_exit(proc, proc.wait()), daemon=True).start()
    return proc


def kill_group(proc, sig=signal.SIGKILL):
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass


def every(seconds, fn):
    """Calls fn every `seconds` on a daemon thread (the emulators' schedulers)."""
    def loop():
        while True:
            time.sleep(seconds)
            fn()
    threading.Thread(target=loop, daemon=True).start()


def serve(handler, port, on_stop, tls_context=None, on_url=None):
    """Serves on 127.0.0.1:port (0: any free one) until SIGTERM or SIGINT, which call on_stop()
    (stop what the emulator runs) and exit. Prints "listening on URL" first, for the tests, after
    on_url(url) if given."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    scheme = "http"
    if tls_context:
        server.socket = tls_context.wrap_socket(server.socket, server_side=True)
        scheme = "https"

    def stop(*_):
        on_stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    if on_url:
        on_url(url)
    print(f"listening on {url}", flush=True)
    server.serve_forever()
