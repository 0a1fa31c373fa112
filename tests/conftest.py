pytest_plugins = [
    "tests.cpu_accounting",
    "tests.lab_support",
    "tests.main_install",
    "tests.pd_lab",
    "tests.k2provision.unit.contract_support",
    "tests.k2provision.access_support",
]
