"""Module k2.cluster.canary_probe: hold a canary, probing it and the other routers meanwhile."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: canary_probe
short_description: Probe a canary's router and the others with one chat completion, for a set time
description:
  - For C(duration) seconds, every C(interval) seconds, sends one chat completion to the
    canary's router and one to the next of the other routers (in turn), each bounded by
    C(timeout), and records how long each took to answer 200 in full, and how many did not.
  - The canary's verdict compares the two sides (k2provision/plan/canary.py). Changes
    nothing; in check mode it sends nothing.
options:
  canary_url:
    description: The canary's router.
    type: str
    required: true
  other_urls:
    description: The other routers.
    type: list
    elements: str
    required: true
  body:
    description: The chat completion's JSON body.
    type: dict
    required: true
  duration:
    description: Seconds to probe (the canary's hold).
    type: int
    required: true
  interval:
    description: Seconds between rounds.
    type: float
    default: 1.0
  timeout:
    description: Seconds one probe may take.
    type: int
    default: 60
  headers:
    description: Request headers (the endpoint's API key).
    type: dict
    default: {}
  ca_path:
    description: A CA file to check the routers' certificates against.
    type: path
author: k2provision
"""

RETURN = r"""
canary:
  description: "{times: [seconds of each probe answered 200], errors: count, error: the last one}"
  type: dict
others:
  description: The same for the other routers.
  type: dict
started:
  description: When the hold started (seconds since the epoch).
  type: float
ended:
  description: When it ended.
  type: float
"""


def _probe(
    url: str, body: bytes, headers: dict[str, str], timeout: int, context: ssl.SSLContext | None
) -> tuple[float | None, str]:
    """How long one chat completion took to answer 200 in full, or why it did not."""
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        body,
        {"Content-Type": "application/json", **headers},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
            reply.read()
    except urllib.error.HTTPError as error:
        return None, f"{url}: HTTP {error.code}"
    except OSError as error:
        return None, f"{url}: {error}"
    return time.monotonic() - started, ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "canary_url": {"type": "str", "required": True},
            "other_urls": {"type": "list", "elements": "str", "required": True},
            "body": {"type": "dict", "required": True},
            "duration": {"type": "int", "required": True},
            "interval": {"type": "float", "default": 1.0},
            "timeout": {"type": "int", "default": 60},
            "headers": {"type": "dict", "default": {}, "no_log": True},
            "ca_path": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    sides: dict[str, dict[str, Any]] = {
        name: {"times": [], "errors": 0, "error": ""} for name in ("canary", "others")
    }
    started = time.time()
    if module.check_mode or not p["other_urls"]:
        module.exit_json(changed=False, started=started, ended=started, **sides)
        return
    context = ssl.create_default_context(cafile=p["ca_path"]) if p["ca_path"] else None
    body = json.dumps(p["body"]).encode()
    headers = {str(k): str(v) for k, v in (p["headers"] or {}).items()}
    deadline = time.monotonic() + p["duration"]
    turn = 0
    while time.monotonic() < deadline:
        round_started = time.monotonic()
        other = p["other_urls"][turn % len(p["other_urls"])]
        turn += 1
        for name, url in (("canary", p["canary_url"]), ("others", other)):
            took, error = _probe(url, body, headers, p["timeout"], context)
            side = sides[name]
            if took is None:
                side["errors"] += 1
                side["error"] = error
            else:
                times: list[float] = side["times"]
                times.append(round(took, 4))
        time.sleep(max(0.0, p["interval"] - (time.monotonic() - round_started)))
    module.exit_json(changed=False, started=started, ended=time.time(), **sides)


if __name__ == "__main__":
    main()
