pytest_plugins = ["tests.lab_support", "tests.main_install", "tests.unit.contract_support"]
