"""Action k2.cluster.host_facts: read a host with the commands of core.facts.FACT_COMMANDS.

One registry names every fact's command, label and parser (``nvidia-smi -q -x``, ``ibstat``,
``ss -Hltn``...); the preflight role reads all of them, the driver role reads the GPUs again
after installing, the RDMA role the topology and its ports. Each command runs over the host's
own connection as a plain read-only command (no module), so it runs in --check too and never
reports a change. A command that is missing or fails leaves its text None; the pure code
(k2.cluster.preflight_problems) decides what that means.

Options:
- plan (required): the plan registered by k2.cluster.plan (the model dir of df/du).
- facts: the keys to read (default: every fact).
- hardware (default true): read the facts that need GPUs or HCAs, on a host the plan gives GPUs.
- dcgm_diag_level (default 1): the level of `dcgmi diag -r`, 1 (quick) to 4 (extended).
- texts: outputs to judge instead of reading (tests and offline audits); keys as the facts'.

Returns: texts ({key: stdout or None}, every key of the registry), read (the commands run).
"""

from __future__ import annotations

import shlex
from typing import Any

from k2provision.ansible.actions import ReadOnlyAction
from k2provision.ansible.plan_parts import NotInPlanError, host_part
from k2provision.core.facts import DEFAULT_DIAG_LEVEL, DIAG_LEVELS, FACT_COMMANDS, FACTS


class ActionModule(ReadOnlyAction):
    """Run the registry's commands on the host; return their outputs by key."""

    def act(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        host = str(task_vars["inventory_hostname"])
        wanted = list(args.get("facts") or FACTS)
        given = args.get("texts") or {}
        unknown = sorted(set(wanted) - set(FACTS)) + sorted(set(given) - set(FACTS))
        if unknown:
            return {
                "failed": True,
                "msg": f"{host}: unknown fact keys {', '.join(unknown)}; fix: use "
                f"{', '.join(FACTS)}",
            }
        level = args.get("dcgm_diag_level", DEFAULT_DIAG_LEVEL)
        if level not in DIAG_LEVELS and str(level) not in map(str, DIAG_LEVELS):
            return {
                "failed": True,
                "msg": f"{host}: DCGM diagnostic level {level!r}; expected one of "
                f"{', '.join(map(str, DIAG_LEVELS))}; fix: set k2_preflight_dcgm_diag_level "
                "to 1 (quick) ... 4 (extended)",
            }
        texts: dict[str, str | None] = dict.fromkeys(FACTS)
        if given:
            texts.update({k: None if v is None else str(v) for k, v in given.items()})
            return {"texts": texts, "read": []}
        try:
            part = host_part(args.get("plan"), host)
        except NotInPlanError as error:
            return {"failed": True, "msg": "\n".join(error.problems)}
        hardware = bool(args.get("hardware", True)) and int(part["gpus"]) > 0
        model_dir = str(args["plan"]["model_dir"])
        read = []
        for fact in FACT_COMMANDS:
            if fact.key not in wanted or (fact.hardware and not hardware):
                continue
            done = self._low_level_execute_command(
                "LC_ALL=C " + shlex.join(fact.command(model_dir, int(level))), sudoable=True
            )
            texts[fact.key] = fact.text(done.get("rc"), done.get("stdout"))
            read.append(fact.label)
        return {"texts": texts, "read": read}
