pytest_plugins = [
    "tests.lab_support",
    "tests.main_install",
    "tests.k2provision.unit.contract_support",
]
