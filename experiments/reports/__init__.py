"""The reports: a sweep's report.md and the study document (docs/results.md), rendered from
results files."""
