"""Task data: the registered tasks, their readers, encoding and batching, pretraining samples, the
device eval arrays, and each task's metrics. One module per job; the public names are all here.

The data root (`--data DIR`, else `EDGEBERT_DATA`, else `../shared/data` next to the repository)
is read in place and never copied: several of these corpora may not be redistributed. The quick default's
SST-2 sample is packaged (`embedded/`), so a first run needs nothing beside the repository.
"""

from .batching import BucketBatchSampler, EncodedDataset, PadCollator, TaskData, make_loader
from .encoding import encode_split, pad
from .evalset import pretokenize_eval
from .metrics import compute_metrics
from .mlm import MLMCollator, nsp_pairs
from .readers import load_task
from .holdout import carve
from .tables import DataConfig, is_data_file, load_data, load_hf, load_table
from .tasks import (
    CONLL_TAGS, DEFAULT_DATA, EMBEDDED_DATA, IGNORE, KINDS, TASKS, Example, Split, Task, data_root, get_task,
    metric_of,
)

__all__ = [
    "CONLL_TAGS", "DEFAULT_DATA", "EMBEDDED_DATA", "IGNORE", "KINDS", "TASKS", "BucketBatchSampler", "DataConfig",
    "EncodedDataset", "Example", "MLMCollator", "PadCollator", "Split", "Task", "TaskData", "carve",
    "compute_metrics", "data_root", "encode_split", "get_task", "is_data_file", "load_data", "load_hf",
    "load_table", "load_task", "make_loader", "metric_of", "nsp_pairs", "pad", "pretokenize_eval",
]
