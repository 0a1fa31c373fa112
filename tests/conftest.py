pytest_plugins = ["tests.lab_support"]
