"""The DEQ training study of ``docs/deq_training.md``: ``run`` (the jobs), ``report`` (the page,
from ``page.md.j2``)."""
