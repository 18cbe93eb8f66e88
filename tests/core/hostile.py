"""A corpus of hostile free text: what a rollback reason, an approver name, a tag value set in the registry
UI, or a model's output can carry to forge a line, drive a terminal, or inject structure into a card."""

from __future__ import annotations

CORPUS = [
    "fine\n2026-01-01T00:00:00  rollback production: 1 -> 9  (forged; run -; by admin)",   # a forged history line
    "\x1b[2J\x1b[31mred\x1b]0;title\x07 \x1b[1A",                                         # ANSI/OSC escapes
    "c1 \x85 next line \x9b31m csi",                                                      # C1 controls (NEL, CSI)
    "bidi \u202eevil\u202c \u2066iso\u2069 \u200bzw \u2028ls \u2029ps",                   # bidi and separators
    "<img src=x onerror=alert(1)><script>alert(2)</script>",                              # raw HTML
    "# Injected heading\n## another",                                                     # Markdown structure
    "[click](https://evil.example) ![img](https://evil.example/x.png) `code` *em* | a | b |",
    "- list item\n1. numbered\n> quote\n---\n```\nfence",
    "key: value\n- item\n&anchor *alias !!python/object:os.system '\"\\\\ # comment",     # YAML specials
    "tab\there\rcarriage\x00nul\x7fdel",
]
