"""The worked example of ``docs/diagnostics.md`` (``run``)."""
