"""Where the launch phase puts the endpoint's API key and TLS files on the endpoint's host (the
router's, or the single server's rank 0): under the plan's config_dir, which every engine
container mounts read-only. One home for the paths the renders name, the launch role writes
(roles/k2_launch/tasks/guard.yml, kept in step by a test) and status reads. The files'
contents never enter a plan, a render or a run record: only these paths do."""

from __future__ import annotations

API_KEY = "secrets/api_key"
"""The key alone (mode 0600): the router's launch script reads it (LaunchValue secret-file)."""
API_KEY_YAML = "secrets/api_key.yaml"
"""`api-key: KEY` (mode 0600): for a server that reads the key from a YAML options file."""
API_KEY_HEADER = "secrets/api_key.header"
"""`Authorization: Bearer KEY` (mode 0600): what the host-side probes send."""
TLS_CERT = "tls/cert.pem"
TLS_KEY = "tls/key.pem"
TLS_CA = "tls/ca.pem"
"""The CA that signed the certificate (k2_tls_ca_file), for verify to check it against."""


def guard_path(config_dir: str, relative: str) -> str:
    """One of the files above, on the host."""
    return f"{config_dir.rstrip('/')}/{relative}"
