"""The shape the k2.cluster action plugins share: controller-side, no file transfer, safe in
check mode (they change nothing), arguments read as plain data."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from k2provision.core.inventory import plain_value


class ReadOnlyAction(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    """An action that changes nothing: subclasses implement :meth:`act`."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        result.update(changed=False)
        result.update(self.act(plain_value(dict(self._task.args)), task_vars or {}))
        return result

    def act(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """The result's fields (``failed`` and ``msg`` to refuse)."""
        raise NotImplementedError
