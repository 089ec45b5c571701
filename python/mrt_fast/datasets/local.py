"""The names of the local select engine, where code written against it finds them.

Selection over a dataset is :func:`mrt_fast.datasets.select_job.select_dataset`
(``engine="local"`` by default); the pieces live by what they are: the select
stage (:mod:`mrt_fast.datasets.select_stage`), the bucket exchange
(:mod:`mrt_fast.datasets.spill`), the report (:mod:`mrt_fast.datasets.report`),
the local executor and its memory plans (:mod:`mrt_fast.datasets.executors.local`,
:mod:`mrt_fast.datasets.executors.local_plan`).
"""

from __future__ import annotations

from mrt_fast._util.memory import available_memory, default_memory_limit, parse_memory, peak_rss, rss
from mrt_fast.datasets.executors.local_plan import (MIN_PART_CANDIDATES, SLACK, WORK_FACTOR, GroupedSize,
                                                    core_threads, dense_budget, grouped_size, plan_grouped)
from mrt_fast.datasets.job import Job, write_part
from mrt_fast.datasets.report import BatchReport
from mrt_fast.datasets.select_job import select_dataset
from mrt_fast.datasets.select_stage import (FIRST, empty_output, layout_hint, list_columns, refuse_missing_embedding,
                                            resolve_layout, select_frame, select_rows, without_embedding)
from mrt_fast.datasets.spill import (ROW, SPILL_DIR, bucket_files, bucket_of, holds_buckets, null_ids_error,
                                     pa_index_type, read_bucket, remove_stale_spills, spill, spill_run,
                                     spill_staging)
from mrt_fast.selection.options import SelectOptions

__all__ = ["BatchReport", "FIRST", "GroupedSize", "Job", "MIN_PART_CANDIDATES", "ROW", "SLACK", "SPILL_DIR",
           "SelectOptions", "WORK_FACTOR", "available_memory", "bucket_files", "bucket_of", "core_threads",
           "default_memory_limit", "dense_budget", "empty_output", "grouped_size", "holds_buckets", "layout_hint",
           "list_columns", "null_ids_error", "pa_index_type", "parse_memory", "peak_rss", "plan_grouped",
           "read_bucket", "refuse_missing_embedding", "remove_stale_spills", "resolve_layout", "rss",
           "select_dataset", "select_frame", "select_rows", "spill", "spill_run", "spill_staging",
           "without_embedding", "write_part"]
