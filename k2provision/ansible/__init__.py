"""Ansible plugins that let ansible-playbook compute the same Plan as the k2provision CLI."""
