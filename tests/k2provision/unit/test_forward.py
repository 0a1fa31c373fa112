"""The endpoint through an SSH port forward: the ssh argv, requests that dial the forward while
naming the endpoint's host, and a forward that cannot open named with its host."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from k2provision.errors import K2Error
from k2provision.ops.connect import ssh_target
from k2provision.ops.forward import (
    Dial,
    connection,
    endpoint_address,
    forward_argv,
    port_forward,
    reachable,
)


def test_endpoint_address_takes_the_schemes_port_when_none_is_named() -> None:
    assert endpoint_address("http://10.0.0.1:8000/") == ("10.0.0.1", 8000)
    assert endpoint_address("https://api.example") == ("api.example", 443)
    assert endpoint_address("http://[fd00::1]:30000") == ("fd00::1", 30000)


def test_forward_argv_keeps_ansibles_options_and_asks_for_the_forward_only() -> None:
    target = ssh_target(
        "h1",
        {
            "ansible_host": "10.0.0.5",
            "ansible_user": "ops",
            "ansible_ssh_common_args": "-o ProxyJump=ops@bastion",
        },
    )
    argv = forward_argv(target, 40001, ("fd00::1", 8000))
    assert argv[0] == "ssh"
    assert argv[1:6] == [
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        "127.0.0.1:40001:[fd00::1]:8000",
    ]
    assert "ProxyJump=ops@bastion" in argv
    assert argv[-1] == "10.0.0.5"


class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(
            {
                "host": self.headers["Host"],
                "path": self.path,
                "auth": self.headers.get("Authorization"),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_a_dialled_connection_reaches_the_local_port_and_names_the_endpoint(server: int) -> None:
    url = "http://k2-endpoint.invalid:8000/v1/models"
    assert not reachable(("k2-endpoint.invalid", 8000), timeout=1)
    conn = connection(url, 5, None, Dial(("127.0.0.1", server)))
    conn.request("GET", "/v1/models", headers={"Authorization": "Bearer k"})
    reply = conn.getresponse()
    assert reply.status == 200
    assert json.loads(reply.read()) == {
        "host": "k2-endpoint.invalid:8000",
        "path": "/v1/models",
        "auth": "Bearer k",
    }
    conn.close()


def test_a_forward_that_does_not_open_names_the_host_and_what_failed() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = ssh_target("h1", {"ansible_host": "127.0.0.1", "ansible_port": port})
    with pytest.raises(K2Error) as error, port_forward(target, ("10.0.0.1", 8000), timeout=15):
        pass
    text = str(error.value)
    assert "h1: no SSH port forward to 10.0.0.1:8000" in text
    assert str(port) in text
