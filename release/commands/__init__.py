"""The commands' implementations: one function per command (api.py), their shared option handling
(support.py), and the commands that are not a feature's own (trace, init, config_doc)."""
