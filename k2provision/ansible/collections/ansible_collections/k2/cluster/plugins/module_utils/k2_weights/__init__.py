"""The weights kernel: the one copy of every weight helper (standard library only, Python 3.9+).

Why it lives here. Ansible modules run on the hosts through AnsiballZ, which bundles only
``ansible.module_utils.*`` and a collection's ``plugins/module_utils/*``: code a module needs
on a host must be in this directory, or the module could not import it there. So the kernel
is a package of this collection's module_utils, and everything else imports it from here:

- the modules (``weights_source``, ``weights_state``) with relative imports
  (``from ..module_utils.k2_weights.store import local_state``); AnsiballZ follows them;
- the controller plugins (filters, actions, lookup) and the k2provision package through the
  package path ``k2provision.ansible.collections.ansible_collections.k2.cluster.plugins
  .module_utils.k2_weights`` (the collection ships inside the package);
- the relay (``relay/``), which runs on every host as one file on the wire: a zipapp built
  from this package (``k2provision.weights.relay_app``), so it carries the same helpers.

Modules, one concern each: ``common`` (formats, errors, byte and address formatting),
``names`` (file names and paths), ``hashing`` (sha256, a resumable sha256), ``safetensors``
(the header check), ``synthetic`` (generated shards for labs and tests), ``manifest`` (the
relay's manifest records), ``store`` (the stored manifest of verified files, scans, free
space), ``events`` (the relay's JSON-lines output). This file imports nothing, so a module
that needs one helper carries only that helper's file to the host.
"""
