"""Module k2.cluster.host_ask: the registry's questions, asked on the host in one script."""

from __future__ import annotations

import sys

from ansible.module_utils.basic import AnsibleModule

from ..module_utils.host_questions import ask_json

DOCUMENTATION = r"""
module: host_ask
short_description: Ask the host questions of the registry, in one script (read-only)
description:
  - Runs the questions of the collection's module_utils host_questions (a container's state,
    an exec'd process's liveness, a health gate's answer, a file's digest...) in one shell
    script and answers each one's record. What the roles ask a host, they ask through here
    (filters such as k2.cluster.state_questions build the questions, others read the records).
options:
  questions:
    description: The questions by key, as host_questions.question_json writes them.
    type: dict
    required: true
author: k2provision
"""

RETURN = r"""
answers:
  description: Each key's record (host_questions.record_json), or null.
  type: dict
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={"questions": {"type": "dict", "required": True}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False, answers=ask_json(module.params["questions"], sys.executable))


if __name__ == "__main__":
    main()
