"""Release gates. Built-ins register through the `relctl.gates` entry-point group, like any plug-in."""
