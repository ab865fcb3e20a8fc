"""Metric sinks: where metrics and result tables go, behind one interface.

``Sink.log(metrics, step)``, ``Sink.log_table(name, rows, step=None)``, ``Sink.close()``;
``MultiSink`` fans out to several. The library ships the file sinks (JSONL and CSV, standard
library only); the experiments add a wandb sink (``experiments.wandb_sink``).
"""

from implicit_ham.tracking.base import MultiSink, Sink, plain_metrics, plain_value
from implicit_ham.tracking.files import CsvFile, CSVSink, JSONLSink, read_jsonl, safe_name

__all__ = [
    "CSVSink",
    "CsvFile",
    "JSONLSink",
    "MultiSink",
    "Sink",
    "plain_metrics",
    "plain_value",
    "read_jsonl",
    "safe_name",
]
