"""Pure helpers shared by tests (no fixtures, no I/O beyond what each function documents)."""
